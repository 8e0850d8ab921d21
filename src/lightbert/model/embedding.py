"""A sentence embedding model: the shared encoder, then one vector per text pooled from its tokens, normalised or not.

This is what sentence-transformers' `Transformer -> Pooling (-> Normalize)` computes, with the same three poolings of
the token vectors (the encoder's last output, after ModernBERT's final norm):
- `mean`: the mean of the real tokens ([CLS] and [SEP] included, padding excluded), sentence-transformers' default;
- `cls`: the [CLS] token's vector, as it is (no tanh pooler: BERT's pooler was trained for next sentence prediction);
- `last`: each text's last real token (sentence-transformers' `lasttoken`), for encoders read left to right.
The encoder has no pooler (`BertModel(add_pooling_layer=False)`): a parameter that gets no gradient would stop DDP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lightbert.model.bert import BertModel
from lightbert.model_config import POOLINGS, BertConfig


def pool(sequence_output: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """One vector per text (B, H) from the token vectors `sequence_output` (B, T, H) under `attention_mask` (B, T),
    right-padded. Computed in fp32 whatever the model's dtype, as sentence-transformers sums in the model's dtype
    and then compares vectors: a bf16 sum over 512 tokens loses the last digits the similarities need."""
    if pooling == "cls":
        return sequence_output[:, 0].float()
    if pooling == "last":
        last = attention_mask.sum(1) - 1  # (B,)
        return sequence_output[torch.arange(len(last), device=last.device), last].float()
    if pooling == "mean":
        weights = attention_mask.to(torch.float32)[:, :, None]  # (B, T, 1)
        summed = (sequence_output.float() * weights).sum(1)  # (B, H)
        return summed / weights.sum(1).clamp(min=1.0)  # an empty text still has [CLS] and [SEP]: never 0
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")


class BertForEmbedding(nn.Module):
    """Encoder -> pooling -> (L2 normalisation): one vector per text (B, H). Parameter names are the encoder's
    (`bert.*`), so a Hugging Face `BertModel` / `ModernBertModel` directory loads one-to-one."""

    def __init__(self, config: BertConfig, pooling: str = "mean", normalize: bool = True):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.config = config
        self.pooling, self.normalize = pooling, normalize
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) inputs -> (B, H) fp32 embeddings."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        sequence_output, _, _ = self.bert(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        embeddings = pool(sequence_output, attention_mask, self.pooling)
        return F.normalize(embeddings, dim=-1) if self.normalize else embeddings
