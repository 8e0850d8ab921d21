"""BERT (Devlin et al., 2019): the shared encoder and its pre-training heads, in one readable file.

Module and parameter names follow Hugging Face's `modeling_bert.py` (`bert.embeddings.word_embeddings`,
`bert.encoder.layer.0.attention.self.query`, `cls.predictions.transform.dense`, ...), so a state dict maps
one to one onto `transformers.BertForPreTraining`.

How this differs from the reference implementations:
- Attention runs through `torch.nn.functional.scaled_dot_product_attention`, which picks a fused kernel
  (flash, cuDNN's or memory-efficient on a GPU) instead of materialising softmax(QK^T) in Python.
- The padding mask is a boolean (B, 1, 1, T) "may attend" mask instead of an additive -10000 bias; the
  outputs of real tokens are the same, padded positions just never receive attention. Left to right over
  right-padded sequences no mask is built at all: the kernel's own causal mask keeps every real query off the
  padding, which lies to its right (`attention_mask_for`).
- Unpadding (`BertModel.unpad`, "groups" unless set): every layer runs on the real tokens only, (N, H) rather
  than (B, T, H), the way MosaicBERT and NVIDIA's recipe skip padding. Attention runs either in length groups, each
  padded to its own longest, or ("varlen") through a variable-length kernel on the (N, H) tokens as they are.
  Real-token outputs are unchanged; outputs at padded positions are zeros instead of the values nobody reads.
  `lightbert.model.layouts` holds these layouts; `forward` picks one per batch (`layout_for`).
- `BertForPreTraining.forward` can compute the MLM head on the masked positions only
  (`masked_positions`): the head's (B·T, H) x (H, V) matmul is the most expensive single op of a small
  BERT and the other ~85% of its rows are thrown away by the loss anyway.
- No cross-attention, past key values or head pruning: BERT never uses them.

What has run on a GPU (one H100, bf16; bench/RESULTS.md, "GPU: the first measurements"): the padded path and
length groups, in training, evaluation and prediction. The variable-length kernel ("varlen") is checked on CPU
against CUDA's meta kernels only; `pytest -m gpu` holds it to the mask path on a GPU.

Shapes: B sequences (rows) in a batch, T tokens per row (padding included), H hidden size, I intermediate size
(4H), A attention heads, D head size (H / A), L layers, V vocabulary size, N tokens the layers run on (the
batch's real tokens when unpadded), M masked positions in a batch, P masked positions per row, K examples per
packed row, C choices of a multiple-choice example.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lightbert.model.layouts import UNPADDING, Layout, PackedRows, Padded, explicit_attention_mask, layout_for
from lightbert.model_config import BertConfig


class BertEmbeddings(nn.Module):
    """Token + segment + position embeddings, then LayerNorm and dropout (paper Fig. 2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.vocab_size is None:  # a run's settings leave it to the tokenizer (run.weights.with_vocabulary)
            raise ValueError("the model config's vocab_size is not set: give the tokenizer's vocabulary size")
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`position_ids` (B, T): each token's position in its own example (packed rows); else 0..T-1."""
        seq_len = input_ids.shape[1]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=input_ids.device)  # (T,), broadcast over the batch
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, T, H)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


QKV = ("query", "key", "value")  # transformers' three projections, in the order of the fused one's rows


def split_qkv(state: dict, prefix: str = "") -> dict:
    """`state` with every fused `...attention.self.qkv.{weight,bias}` (3H rows) under `prefix` as transformers' three
    entries `query`, `key` and `value` (H rows each, views), where the fused ones stood and in transformers' order;
    the other entries as they were. In place, and returned."""
    ends = ("attention.self.qkv.weight", "attention.self.qkv.bias")
    if not any(k.startswith(prefix) and k.endswith(ends) for k in state):
        return state
    items = list(state.items())
    fused = {k: v for k, v in items if k.startswith(prefix) and k.endswith(ends)}
    state.clear()
    for key, value in items:
        if key not in fused:
            state[key] = value
            continue
        head = key.rsplit(".", 2)[0]  # "...attention.self"
        if f"{head}.query.weight" in state or f"{head}.query.bias" in state:
            continue  # emitted with its sibling
        parts = {
            kind: fused[f"{head}.qkv.{kind}"].chunk(3) for kind in ("weight", "bias") if f"{head}.qkv.{kind}" in fused
        }
        for i, name in enumerate(QKV):
            for kind, chunks in parts.items():
                state[f"{head}.{name}.{kind}"] = chunks[i]
    return state


def join_qkv(state: dict, prefix: str = "") -> dict:
    """The inverse of `split_qkv`: transformers' `...attention.self.{query,key,value}.{weight,bias}` (all three
    present) as one fused `qkv` entry, concatenated in that order. In place, and returned."""
    for key in [
        k
        for k in state
        if k.startswith(prefix) and k.endswith(("attention.self.query.weight", "attention.self.query.bias"))
    ]:
        head, kind = key.rsplit(".", 2)[0], key.rsplit(".", 1)[1]
        names = [f"{head}.{name}.{kind}" for name in QKV]
        if all(name in state for name in names):
            state[f"{head}.qkv.{kind}"] = torch.cat([state.pop(name) for name in names])
    return state


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention: every token attends to every real token.

    Query, key and value come from one fused projection `qkv` (H -> 3H, one GEMM instead of three, as in NVIDIA's
    and MosaicBERT's BERT). Its state dict keeps transformers' three names (`query`, `key`, `value`: split on save,
    joined on load, by this module's state-dict hooks), so checkpoints still map one to one.
    """

    row_blocks: ClassVar[dict[str, int]] = {
        "qkv.weight": 3
    }  # LAMB's trust ratio: one per transformers' weight (lightbert.optim)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # rows: query, key, value
        self.dropout_p = config.attention_probs_dropout_prob
        self.split_names = True  # state dicts name query, key and value apart (`fused_qkv_names` turns it off)
        self.register_state_dict_post_hook(_split_on_save)
        self.register_load_state_dict_pre_hook(_join_on_load)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        """x is (B, T, H), or (N, H) where `layout` runs the layers on fewer tokens; the output has x's shape."""
        qkv = self.qkv(x)  # (..., 3H): query, key and value side by side; the layout splits them (views)
        return layout.attention(qkv, self.num_heads, self.dropout_p if self.training else 0.0)

    def probabilities(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(QK^T / sqrt(D)) (B, A, T, T): what the fused kernel computes inside, for looking at heads."""
        batch, seq_len, _ = x.shape
        q, k, _ = (
            t.reshape(batch, seq_len, self.num_heads, self.head_size).transpose(1, 2) for t in self.qkv(x).chunk(3, -1)
        )
        scores = q @ k.transpose(-1, -2) / self.head_size**0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        return scores.softmax(-1)


def _split_on_save(module: BertSelfAttention, state: dict, prefix: str, local_metadata: dict) -> None:
    if module.split_names:
        split_qkv(state, prefix)


def _join_on_load(module: BertSelfAttention, state: dict, prefix: str, *_) -> None:
    join_qkv(state, prefix)  # a state dict with the fused names (`fused_qkv_names`) loads as it is


@contextlib.contextmanager
def fused_qkv_names(model: nn.Module):
    """Within it, `model`'s state dict names the fused projections as the parameters they are (`qkv`): for
    torch.distributed.checkpoint, which maps every state-dict key onto a parameter (FSDP's full state dict). Turn
    the result into transformers' names with `split_qkv`."""
    attentions = [m for m in model.modules() if isinstance(m, BertSelfAttention)]
    for m in attentions:
        m.split_names = False
    try:
        yield
    finally:
        for m in attentions:
            m.split_names = True


class BertSelfOutput(nn.Module):
    """Projection after attention, dropout, then the post-LN residual: LayerNorm(x + f(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        return self.output(self.self(x, layout), x)


class BertIntermediate(nn.Module):
    """First feed-forward layer with the exact (erf) GELU the reference uses, not the tanh approximation."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # (..., I)


class BertOutput(BertSelfOutput):
    """Second feed-forward layer back to H, dropout, post-LN residual."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)


class BertLayer(nn.Module):
    """One post-LN Transformer block; also the unit FSDP wraps."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        x = self.attention(x, layout)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertPooler(nn.Module):
    """Dense + tanh on the [CLS] position: the sentence representation the NSP and GLUE heads read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """From [CLS]; a left-to-right encoder's [CLS] sees only itself, so it reads each sequence's `last` real
        token instead (B,), as OpenAI GPT classifies from its final token."""
        if last is None:
            return torch.tanh(self.dense(sequence_output[:, 0]))  # (B, H)
        return torch.tanh(self.dense(sequence_output[torch.arange(len(last), device=last.device), last]))

    def at(self, sequence_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """At several positions per row (B, K), e.g. each packed example's [CLS]: (B, K, H)."""
        index = positions[:, :, None].expand(-1, -1, sequence_output.shape[-1])
        return torch.tanh(self.dense(sequence_output.gather(1, index)))


class BertModel(nn.Module):
    """The shared encoder: embeddings, L Transformer blocks, pooler. Every task wraps this.

    Token-level heads (SQuAD spans) build it without the pooler, as Hugging Face does: a parameter that gets no
    gradient would also stop DDP, and the names stay one-to-one with their fine-tuned checkpoints.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.set_unpadding("groups")

    @property
    def unpad(self) -> str:
        """How the layers skip padding (`UNPADDING`), set by `set_unpadding`."""
        return self._unpad

    def set_unpadding(self, how: str) -> BertModel:
        """How the layers skip padding from now on (the run's `speed.unpad`): "off" (padded (B, T) batches
        throughout), "groups" (every layer on the real tokens; attention in length groups, each padded to its own
        longest) or "varlen" (every layer, attention included, on the real tokens, through a variable-length
        kernel; packed rows too). The outputs at real tokens do not depend on it. Returns the model."""
        if how not in UNPADDING:
            raise ValueError(f"BertModel.set_unpadding takes one of {', '.join(UNPADDING)}, got {how!r}")
        self._unpad = how
        return self

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        causal: bool | None = None,
        packed: PackedRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...] | None]:
        """Returns (sequence_output (B, T, H), pooled_output (B, H) or None without a pooler, hidden_states or None).

        `causal` is the attention's direction for this call: each token attends to itself and the tokens to its left
        only (None: as `config.attention` says; the paper's LTR model is trained and fine-tuned that way).

        `hidden_states`, when asked for, holds the embedding output and each layer's output: L + 1 tensors,
        as in Hugging Face.

        `packed`: several examples per row (`PackedRows`). Attention stays within each example, positions restart
        at each, and the pooled output is (B, K, H), at each example's [CLS]. Shapes depend on nothing but the
        batch's: no host sync, one graph under torch.compile.
        """
        causal = self.config.causal if causal is None else causal
        layout = layout_for(attention_mask, packed, self.unpad, causal)
        x = self.embeddings(input_ids, token_type_ids, packed.position_ids if packed is not None else None)
        hidden_states = [x] if output_hidden_states else None
        x = layout.unpad(x)  # (N, H) where the layers skip padding
        for layer in self.encoder.layer:
            x = layer(x, layout)
            if hidden_states is not None:
                hidden_states.append(layout.pad(x))
        x = layout.pad(x)  # (B, T, H)
        pooled = None
        if self.pooler is not None and packed is not None:  # every example's [CLS]; empty slots read position 0
            pooled = self.pooler.at(x, packed.cls_positions)  # (B, K, H)
        elif self.pooler is not None:
            pooled = self.pool(x, attention_mask, causal)
        return x, pooled, tuple(hidden_states) if hidden_states is not None else None

    def pool(self, x: torch.Tensor, attention_mask: torch.Tensor | None, causal: bool | None = None) -> torch.Tensor:
        """The pooler on `x` (B, T, H): at [CLS], or, left to right, at each sequence's last real token."""
        if not (self.config.causal if causal is None else causal):
            return self.pooler(x)
        if attention_mask is None:
            return self.pooler(x, x.new_full((x.shape[0],), x.shape[1] - 1, dtype=torch.long))
        return self.pooler(x, attention_mask.sum(1) - 1)

    @torch.no_grad()
    def attentions(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Every layer's attention probabilities (B, A, T, T), as Hugging Face's `output_attentions` gives them.

        A separate pass: the fused kernel of `forward` never materialises them.
        """
        # The probabilities are computed by hand, so the mask is spelled out.
        attn_mask = explicit_attention_mask(attention_mask, input_ids.shape[1], self.config.causal, input_ids.device)
        layout = Padded(attn_mask)
        x = self.embeddings(input_ids, token_type_ids)
        maps = []
        for layer in self.encoder.layer:
            maps.append(layer.attention.self.probabilities(x, attn_mask))
            x = layer(x, layout)
        return tuple(maps)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """MLM head: transform, then a decoder whose weight is the word embedding matrix, with its own bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one (V, H) tensor, as in the paper
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(x), self.decoder.weight, self.bias)  # (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding, next_sentence: bool = True):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2) if next_sentence else None


class BertForPreTraining(nn.Module):
    """Encoder + masked-LM head + next-sentence head (paper §3.1).

    Without `next_sentence` (the paper's "No NSP" and "LTR & No NSP" rows, Table 5) there is no NSP head and no
    pooler, which only that head reads: a fine-tuned classifier starts its pooler fresh, as it starts its head. The
    LM head predicts masked tokens, or, for a left-to-right config, each next token (the labels say which).
    """

    def __init__(self, config: BertConfig, next_sentence: bool = True):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=next_sentence)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings, next_sentence)
        self.apply(lambda module: init_weights(module, config.initializer_range))
        with torch.no_grad():  # the tied decoder was re-drawn after the embedding: zero [PAD]'s row again
            self.bert.embeddings.word_embeddings.weight[config.pad_token_id].zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        packed: PackedRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (MLM logits, NSP logits (B, 2) (packed: (B, K, 2)), or None without the NSP head).

        MLM logits are (B, T, V) for every position; (M, V) for the M positions where the boolean
        `masked_positions` (B, T) is true, in row-major order (the order of `labels[masked_positions]`); or
        (B, P, V) at the P positions per row of an integer `masked_positions` (B, P), a shape fixed in advance.
        """
        sequence_output, pooled_output, _ = self.bert(input_ids, token_type_ids, attention_mask, packed=packed)
        if masked_positions is not None and masked_positions.dtype == torch.bool:
            sequence_output = sequence_output[masked_positions]  # (M, H)
        elif masked_positions is not None:
            index = masked_positions.unsqueeze(-1).expand(-1, -1, sequence_output.shape[-1])  # (B, P, H)
            sequence_output = sequence_output.gather(1, index)  # (B, P, H)
        mlm_logits = self.cls.predictions(sequence_output)
        nsp_logits = self.cls.seq_relationship(pooled_output) if self.cls.seq_relationship is not None else None
        return mlm_logits, nsp_logits


def init_weights(module: nn.Module, std: float) -> None:
    """The reference initialisation: N(0, 0.02) weights, zero biases, LayerNorm weight 1 and bias 0."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def run_packed(lstm: nn.LSTM, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """A batch-first LSTM over each sequence's real tokens only (packed), so that padding never reaches the
    backward direction; zeros at padded positions, the input's length kept."""
    if attention_mask is None:
        return lstm(x)[0]
    lengths = attention_mask.sum(-1).cpu()
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    return pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=x.shape[1])[0]


class SequenceBiLSTM(nn.Module):
    """A randomly initialised bidirectional LSTM on the encoder's output: the paper's "+ BiLSTM" row of Table 5, added
    at fine-tuning on top of the left-to-right model. H/2 units per direction, so its output (B, T, H) takes the
    encoder's place under the task's head."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.lstm = nn.LSTM(config.hidden_size, config.hidden_size // 2, bidirectional=True, batch_first=True)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return run_packed(self.lstm, x, attention_mask)


class BertForSequenceClassification(nn.Module):
    """Encoder + dropout + one linear layer on the pooled [CLS] vector (paper §4.1).

    `num_labels == 1` makes it a regression head (STS-B). Names match Hugging Face's class of the same name,
    so its fine-tuned checkpoints load one-to-one.
    """

    def __init__(self, config: BertConfig, num_labels: int, bilstm: bool = False):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.bilstm = SequenceBiLSTM(config) if bilstm else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sequence_output, pooled_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        if self.bilstm is not None:  # the pooler reads the BiLSTM's output where it read the encoder's
            pooled_output = self.bert.pool(self.bilstm(sequence_output, attention_mask), attention_mask)
        return self.classifier(self.dropout(pooled_output))  # (B, num_labels)


class BertForQuestionAnswering(nn.Module):
    """Encoder + one linear layer giving each token a start and an end logit (paper §4.2, §4.3).

    For SQuAD v2.0 the [CLS] position stands for "no answer". No dropout on the head, as in the reference and
    in Hugging Face's class of the same name, whose parameter names these are (`qa_outputs`).
    """

    def __init__(self, config: BertConfig, bilstm: bool = False):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.bilstm = SequenceBiLSTM(config) if bilstm else None
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (start logits (B, T), end logits (B, T))."""
        sequence_output, _, _ = self.bert(input_ids, token_type_ids, attention_mask)
        if self.bilstm is not None:
            sequence_output = self.bilstm(sequence_output, attention_mask)
        start_logits, end_logits = self.qa_outputs(sequence_output).unbind(-1)  # (B, T, 2) -> 2 x (B, T)
        return start_logits, end_logits


class BertForTokenClassification(nn.Module):
    """Encoder + dropout + one linear layer giving every token a label (paper §5.3, NER).

    Every sub-token gets logits; the task reads a word's label off its first sub-token. Names and the missing
    pooler match Hugging Face's class of the same name.
    """

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sequence_output, _, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.classifier(self.dropout(sequence_output))  # (B, T, num_labels)


class BertForMultipleChoice(nn.Module):
    """Encoder + dropout + one linear layer scoring each (context, choice) pair from its pooled [CLS] (paper §4.4).

    Inputs are (B, C, T) for C choices; the scores (B, C) feed a softmax over the choices. Names match Hugging
    Face's class of the same name.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch, choices, length = input_ids.shape
        flat = [t.reshape(batch * choices, length) if t is not None else None for t in (token_type_ids, attention_mask)]
        _, pooled_output, _ = self.bert(input_ids.reshape(batch * choices, length), *flat)
        return self.classifier(self.dropout(pooled_output)).view(batch, choices)  # (B, C)
