"""BERT (Devlin et al., 2019): the shared encoder and its pre-training heads, in one readable file.

Module and parameter names follow Hugging Face's `modeling_bert.py` (`bert.embeddings.word_embeddings`,
`bert.encoder.layer.0.attention.self.query`, `cls.predictions.transform.dense`, ...), so a state dict maps
one to one onto `transformers.BertForPreTraining`.

How this differs from the reference implementations:
- Attention runs through `torch.nn.functional.scaled_dot_product_attention`, which picks a fused kernel
  (flash / memory-efficient on GPU) instead of materialising softmax(QK^T) in Python.
- The padding mask is a boolean (B, 1, 1, T) "may attend" mask instead of an additive -10000 bias; the
  outputs of real tokens are the same, padded positions just never receive attention. Left to right over
  right-padded sequences no mask is built at all: the kernel's own causal mask keeps every real query off the
  padding, which lies to its right (`attention_mask_for`).
- Unpadding (`BertModel.unpad`, on by default): every layer runs on the real tokens only, (N, H) rather than
  (B, T, H), the way MosaicBERT and NVIDIA's recipe skip padding. Attention runs either in length groups, each
  padded to its own longest, or ("varlen") through a variable-length kernel on the (N, H) tokens as they are
  (`lightbert.model.varlen`). Real-token outputs are unchanged; outputs at padded positions are zeros instead of
  the values nobody reads.
- `BertForPreTraining.forward` can compute the MLM head on the masked positions only
  (`masked_positions`): the head's (N, H) x (H, V) matmul is the most expensive single op of a small
  BERT and the other ~85% of its rows are thrown away by the loss anyway.
- No cross-attention, past key values or head pruning: BERT never uses them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lightbert.model.config import BertConfig
from lightbert.model.varlen import Segments, varlen_attention

UNPADDING = ("off", "groups", "varlen")  # BertModel.unpad


class BertEmbeddings(nn.Module):
    """Token + segment + position embeddings, then LayerNorm and dropout (paper Fig. 2)."""

    def __init__(self, config: BertConfig):
        super().__init__()
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


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention: every token attends to every real token."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        tokens: RealTokens | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """x is (B, T, H), or (N, H) real tokens when `tokens` says where they sit; the output has x's layout.
        `is_causal`: the kernel masks every key right of its query (on top of `attn_mask`, which is then None)."""
        q, k, v = self.query(x), self.key(x), self.value(x)
        dropout_p = self.dropout_p if self.training else 0.0
        if tokens is not None and tokens.attends_unpadded:  # length groups, or a variable-length kernel
            return tokens.attention(q, k, v, self.num_heads, dropout_p, is_causal)
        if tokens is not None:  # attention needs the (B, T) layout back
            q, k, v = tokens.pad(q), tokens.pad(k), tokens.pad(v)
        batch, seq_len, hidden = q.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, A, T, D)
            return t.view(batch, seq_len, self.num_heads, self.head_size).transpose(1, 2)

        # On CUDA a boolean mask rules out the flash kernel; the memory-efficient one takes the mask and dropout in
        # bf16 (it pads the mask's last dimension to its alignment itself). No query row is fully masked (the mask
        # hides keys, and every sequence has real tokens), so no kernel meets the all-masked softmax that gives NaN.
        out = F.scaled_dot_product_attention(
            heads(q), heads(k), heads(v), attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
        )
        out = out.transpose(1, 2).reshape(batch, seq_len, hidden)  # (B, A, T, D) -> (B, T, H)
        return tokens.unpad(out) if tokens is not None else out

    def probabilities(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(QK^T / sqrt(D)) (B, A, T, T): what the fused kernel computes inside, for looking at heads."""
        batch, seq_len, _ = x.shape
        q, k = (
            t(x).view(batch, seq_len, self.num_heads, self.head_size).transpose(1, 2) for t in (self.query, self.key)
        )
        scores = q @ k.transpose(-1, -2) / self.head_size**0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        return scores.softmax(-1)


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

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        tokens: RealTokens | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        return self.output(self.self(x, attn_mask, tokens, is_causal), x)


class BertIntermediate(nn.Module):
    """First feed-forward layer with the exact (erf) GELU the reference uses, not the tanh approximation."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # (B, T, 4H)


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

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        tokens: RealTokens | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        x = self.attention(x, attn_mask, tokens, is_causal)
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


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) example numbers of a packed row (1, 2, ...; 0 at padding) -> (B, 1, T, T) boolean mask: a token attends
    to the tokens of its own example only. Padding attends to padding, so no query row is fully masked."""
    return (document_ids[:, :, None] == document_ids[:, None, :])[:, None]


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 mask of real tokens -> (B, 1, 1, T) boolean mask of keys each query may attend to."""
    if attention_mask is None:
        return None
    return attention_mask.bool()[:, None, None, :]


def attention_mask_for(
    attention_mask: torch.Tensor | None, seq_len: int, causal: bool, device: torch.device
) -> tuple[torch.Tensor | None, bool]:
    """The keys each query may attend to, as (mask, is_causal) for the attention kernel: the real ones (B, 1, 1, T)
    and, left to right, only those at or before the query.

    Left to right, when every sequence's padding is at its end (as every collator here pads), the kernel's causal
    mask alone is enough: a real query's keys at or before it are all real. That is (None, True): no (T, T) mask,
    the flash kernel on a GPU, and the length groups of unpadding still apply. Otherwise (left padding, holes) the
    full (B, 1, T, T) mask."""
    if causal and (attention_mask is None or padded_at_the_end(attention_mask)):
        return None, True
    return explicit_attention_mask(attention_mask, seq_len, causal, device), False


def explicit_attention_mask(
    attention_mask: torch.Tensor | None, seq_len: int, causal: bool, device: torch.device
) -> torch.Tensor | None:
    """The keys each query may attend to, spelled out: the real ones (B, 1, 1, T) and, left to right, only those at
    or before the query (B, 1, T, T). A query's own position is always allowed, so no row is fully masked."""
    mask = padding_mask(attention_mask)
    if not causal:
        return mask
    left = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, T, T)
    return left if mask is None else mask & left


def padded_at_the_end(attention_mask: torch.Tensor) -> bool:
    """Whether each row of the (B, T) mask is its real tokens, then only padding."""
    slots = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return bool((attention_mask.bool() == (slots < attention_mask.sum(1, keepdim=True))).all())


class PackedRows(NamedTuple):
    """Where the examples of packed rows sit (`lightbert.pretraining.packing`): `document_ids` (B, T) each token's
    example in its row (1, 2, ...; 0 at padding), `position_ids` (B, T) its position within that example, and
    `cls_positions` (B, K) each example's [CLS] (0 for a row's empty slots)."""

    document_ids: torch.Tensor
    position_ids: torch.Tensor
    cls_positions: torch.Tensor


class RealTokens:
    """Where the real tokens of a padded (B, T) batch sit, to move activations between (B, T, H) and (N, H), and
    how attention runs on them (`attention`): in length groups, or, with `varlen`, through a variable-length kernel
    on the (N, H) tokens as they are. Without either (`attends_unpadded` false) attention pads them back."""

    def __init__(self, attention_mask: torch.Tensor, varlen: bool = False):
        self.batch, self.seq_len = attention_mask.shape
        self.index = attention_mask.flatten().nonzero().squeeze(1)  # (N,) positions in the flattened batch
        self.segments = Segments.of_padded(attention_mask) if varlen else None
        self.groups = None if varlen else length_groups(attention_mask, len(self.index))

    @property
    def attends_unpadded(self) -> bool:
        return self.segments is not None or self.groups is not None

    def unpad(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (N, H)
        return x.flatten(0, 1).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:  # (N, H) -> (B, T, H), zeros at padding
        padded = x.new_zeros(self.batch * self.seq_len, x.shape[-1]).index_copy(0, self.index, x)
        return padded.view(self.batch, self.seq_len, -1)

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, dropout_p: float, is_causal: bool = False
    ):
        """Attention of the real tokens q, k, v (N, H) -> (N, H), each length group padded to its own longest.

        The same result as attention over the (B, T) batch with the padding mask: every query attends to the real
        keys of its own sequence (left to right, `is_causal`: those at or before it; a group's padding is at the
        end of each row, so the causal mask alone keeps real queries off it). Attention's work grows with the
        square of the padded length, so a batch of mixed lengths (fine-tuning: SST-2's sentences are a third of
        their batch's longest) does a fraction of it.
        """
        if self.segments is not None:
            return varlen_attention(q, k, v, self.segments, heads, dropout_p, is_causal)
        hidden = q.shape[-1]
        qkv = torch.cat([torch.cat([q, k, v], dim=1), q.new_zeros(1, 3 * hidden)])  # (N + 1, 3H); row N pads
        outputs = []
        for group in self.groups.parts:
            b, t = group.mask.shape[0], group.mask.shape[-1]
            rows = qkv.index_select(0, group.gather).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            mask = None if is_causal else group.mask
            out = F.scaled_dot_product_attention(
                rows[0], rows[1], rows[2], attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
            )
            outputs.append(out.transpose(1, 2).reshape(b * t, hidden).index_select(0, group.keep))  # (n_g, H)
        return torch.cat(outputs).index_select(0, self.groups.order)  # back to the tokens' order


class PackedTokens:
    """Every token of packed rows (B, T), flattened: (B, T, H) <-> (B·T, H) are views, not copies, and attention runs
    through the variable-length kernel within each example (`Segments.of_packed_rows`; a row's padding attends to
    itself, and nobody reads it)."""

    attends_unpadded = True

    def __init__(self, packed: PackedRows):
        self.batch, self.seq_len = packed.document_ids.shape
        self.segments = Segments.of_packed_rows(packed.document_ids, packed.cls_positions.shape[1])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B·T, H)
        return x.flatten(0, 1)

    def pad(self, x: torch.Tensor) -> torch.Tensor:  # (B·T, H) -> (B, T, H)
        return x.view(self.batch, self.seq_len, -1)

    def attention(self, q, k, v, heads: int, dropout_p: float, is_causal: bool = False) -> torch.Tensor:
        return varlen_attention(q, k, v, self.segments, heads, dropout_p, is_causal)


class LengthGroup:
    """Sequences of similar length, attended to together: `gather` (b·t,) picks their real tokens' rows (row N is
    zeros, for padding), `mask` (b, 1, 1, t) their keys, `keep` (n_g,) the real rows of the output."""

    def __init__(self, gather: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor):
        self.gather, self.mask, self.keep = gather, mask, keep


class LengthGroups:
    def __init__(self, parts: list[LengthGroup], order: torch.Tensor):
        self.parts, self.order = parts, order  # order: the groups' outputs, concatenated, back to token order


def length_groups(attention_mask: torch.Tensor, num_tokens: int, max_groups: int = 4) -> LengthGroups | None:
    """Up to `max_groups` groups of sequences by length (equal counts, longest first), or None when grouping would
    save under 40% of attention's work (sum over groups of size x longest^2, against B x T^2): then the padded
    (B, T) layout is as good. Reads the lengths on the host (one sync, as unpadding itself needs)."""
    lengths = attention_mask.sum(1)
    counts = lengths.tolist()
    batch, seq_len = attention_mask.shape
    ordered = sorted(range(batch), key=lambda i: -counts[i])
    size = -(-batch // min(max_groups, batch))
    chunks = [ordered[i : i + size] for i in range(0, batch, size)]
    if sum(len(c) * counts[c[0]] ** 2 for c in chunks) > 0.6 * batch * seq_len**2:
        return None
    starts = lengths.cumsum(0) - lengths  # where each sequence's real tokens begin among the N
    parts, destinations = [], []
    for chunk in chunks:
        members = torch.tensor(chunk, device=attention_mask.device)
        slots = torch.arange(counts[chunk[0]], device=attention_mask.device)
        real = slots[None, :] < lengths[members][:, None]  # (b, t)
        gather = torch.where(real, starts[members][:, None] + slots, num_tokens).flatten()
        keep = real.flatten().nonzero().squeeze(1)
        parts.append(LengthGroup(gather, real[:, None, None, :], keep))
        destinations.append(gather.index_select(0, keep))
    order = torch.empty(num_tokens, dtype=torch.long, device=attention_mask.device)
    order[torch.cat(destinations)] = torch.arange(num_tokens, device=attention_mask.device)
    return LengthGroups(parts, order)


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
        self.unpad = "groups"  # how to skip padding (config: speed.unpad)

    @property
    def unpad(self) -> str:
        """How the layers skip padding (`UNPADDING`): "off" (padded (B, T) batches throughout), "groups" (every layer
        on the real tokens; attention in length groups, each padded to its own longest) or "varlen" (every layer,
        attention included, on the real tokens, through a variable-length kernel; packed rows too)."""
        return self._unpad

    @unpad.setter
    def unpad(self, how: str) -> None:
        if how not in UNPADDING:
            raise ValueError(f"BertModel.unpad is one of {', '.join(UNPADDING)}, got {how!r}")
        self._unpad = how

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
        tokens = None
        if packed is None:
            attn_mask, is_causal = attention_mask_for(attention_mask, input_ids.shape[1], causal, input_ids.device)
            if self.unpad != "off" and attention_mask is not None and not bool(attention_mask.all()):
                tokens = RealTokens(attention_mask, varlen=self.unpad == "varlen")
                if tokens.segments is not None:  # each sequence's real tokens, in order: any padding, either way
                    attn_mask, is_causal = None, causal
                elif causal and not is_causal:  # groups carry padding masks only: attend in (B, T), full mask
                    tokens.groups = None
        elif causal:
            raise ValueError("packed rows are for bidirectional encoders (a left-to-right model reads no [CLS])")
        elif self.unpad == "varlen":
            tokens, attn_mask, is_causal = PackedTokens(packed), None, False
        else:
            attn_mask, is_causal = document_mask(packed.document_ids), False
        x = self.embeddings(input_ids, token_type_ids, packed.position_ids if packed is not None else None)
        hidden_states = [x] if output_hidden_states else None
        if tokens is not None:
            x = tokens.unpad(x)  # (N, H)
        for layer in self.encoder.layer:
            x = layer(x, attn_mask, tokens, is_causal)
            if hidden_states is not None:
                hidden_states.append(tokens.pad(x) if tokens is not None else x)
        if tokens is not None:
            x = tokens.pad(x)  # (B, T, H)
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
        """Every layer's attention probabilities (B, heads, T, T), as Hugging Face's `output_attentions` gives them.

        A separate pass: the fused kernel of `forward` never materialises them.
        """
        # The probabilities are computed by hand, so the mask is spelled out.
        attn_mask = explicit_attention_mask(attention_mask, input_ids.shape[1], self.config.causal, input_ids.device)
        x = self.embeddings(input_ids, token_type_ids)
        maps = []
        for layer in self.encoder.layer:
            maps.append(layer.attention.self.probabilities(x, attn_mask))
            x = layer(x, attn_mask)
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

        MLM logits are (B, T, V) for every position; (N, V) for the N positions where the boolean
        `masked_positions` (B, T) is true, in row-major order (the order of `labels[masked_positions]`); or
        (B, P, V) at the P positions per row of an integer `masked_positions` (B, P), a shape fixed in advance.
        """
        sequence_output, pooled_output, _ = self.bert(input_ids, token_type_ids, attention_mask, packed=packed)
        if masked_positions is not None and masked_positions.dtype == torch.bool:
            sequence_output = sequence_output[masked_positions]  # (N, H)
        elif masked_positions is not None:
            index = masked_positions[:, :, None].expand(-1, -1, sequence_output.shape[-1])
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
