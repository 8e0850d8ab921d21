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

The modern recipe (ModernBERT, Warner et al. 2024) is a set of options of this same encoder (`BertConfig`'s
`norm_position`, `*_bias`, `mlp`, `position_embedding_type`, `global_attn_every_n_layers`, `local_attention`,
`final_norm`, `pooler`, `initializer`; conf/model/modernbert_*.yaml). It keeps this file's names, and
`checkpoints.hf_format` maps them onto transformers' `ModernBertForMaskedLM` (`model.layers.0.attn.Wqkv` <- this
file's query/key/value, ...):
- Pre-LN: each layer is x + f(LayerNorm(x)) (`attention_norm`, `mlp_norm`); with the embeddings normed, layer 0 has
  no attention norm, as transformers' ModernBERT; a `final_norm` after the last layer.
- Rotary positions (`RotaryEmbedding`) on queries and keys, with one base for the global layers and one for the
  sliding-window ones; no position table. Sliding-window layers see |i - j| <= local_attention // 2
  (`lightbert.model.layouts.band`; flash's window on the varlen path).
- GeGLU: `intermediate.dense` is (H, 2I), its output split as (input, gate), GELU on the input half.
- The MLM head is BERT's shape (dense -> GELU -> LayerNorm -> tied decoder with a bias), its biases per config; the
  "head" pooler (ModernBertForSequenceClassification's) pools [CLS] or the mean, then dense -> GELU -> LayerNorm,
  and the token-level heads run the same transform on every token (`TokenHead`), as transformers' do.
- Dropout sits where BERT's does (after each projection back to H); transformers' ModernBERT drops inside the MLP and
  after attention's output. Its recipe trains without dropout (all 0.0), where the two are the same.
- The weights start as ModernBERT's (`initializer: modernbert`, `init_modernbert`): truncated normals with a std per
  role, as transformers' `ModernBertPreTrainedModel._init_weights` draws them; BERT's N(0, 0.02) otherwise.

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
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lightbert.model.layouts import (
    UNPADDING,
    Layout,
    PackedRows,
    Padded,
    explicit_attention_mask,
    layout_for,
    with_window,
)
from lightbert.model_config import BertConfig

VOCAB_MULTIPLE = 64  # the word embeddings' and MLM decoder's rows, inside the model (tensor cores' alignment)


def layer_norm(config: BertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


def padded_vocab(size: int) -> int:
    """`size` rounded up to a multiple of `VOCAB_MULTIPLE`: the rows the model holds for a vocabulary of `size`."""
    return -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


class CheckpointLayout:
    """A module whose parameters are laid out for speed (a fused projection, padded rows) while its state dict keeps
    transformers' layout: `to_checkpoint` turns its entries of a state dict (names under `prefix`) into transformers'
    on save, `from_checkpoint` back into the parameters' on load (as it is when they are so already). Both only
    touch the entries present."""

    def _keep_checkpoint_layout(self: nn.Module) -> None:
        self.checkpoint_layout = True  # False within `parameter_layout`
        self.register_state_dict_post_hook(_to_checkpoint_on_save)
        self.register_load_state_dict_pre_hook(_from_checkpoint_on_load)

    def to_checkpoint(self, state: dict, prefix: str) -> None:
        raise NotImplementedError

    def from_checkpoint(self, state: dict, prefix: str) -> None:
        raise NotImplementedError


def _to_checkpoint_on_save(module, state: dict, prefix: str, local_metadata: dict) -> None:
    if module.checkpoint_layout:
        module.to_checkpoint(state, prefix)


def _from_checkpoint_on_load(module, state: dict, prefix: str, *_) -> None:
    module.from_checkpoint(state, prefix)


@contextlib.contextmanager
def parameter_layout(model: nn.Module):
    """Within it, `model`'s state dict holds its parameters as they are (the fused `qkv`, the padded rows): for
    torch.distributed.checkpoint, which maps every state-dict key onto a parameter of that shape (FSDP's full state
    dict), and for what maps state-dict entries to parameters. `to_checkpoint` turns the result into transformers'
    layout."""
    modules = [m for m in model.modules() if isinstance(m, CheckpointLayout)]
    for m in modules:
        m.checkpoint_layout = False
    try:
        yield
    finally:
        for m in modules:
            m.checkpoint_layout = True


def to_checkpoint(model: nn.Module, state: dict) -> dict:
    """A state dict of `model` in its parameters' layout (`parameter_layout`; keys as its `state_dict()`'s, any
    subset) in transformers' layout, as its `state_dict()` gives it. In place, and returned."""
    for name, module in model.named_modules():
        if isinstance(module, CheckpointLayout):
            module.to_checkpoint(state, f"{name}." if name else "")
    return state


def from_checkpoint(model: nn.Module, state: dict) -> dict:
    """The inverse of `to_checkpoint`: a checkpoint's state dict in `model`'s parameters' layout. In place, and
    returned."""
    for name, module in model.named_modules():
        if isinstance(module, CheckpointLayout):
            module.from_checkpoint(state, f"{name}." if name else "")
    return state


def rows_cut(state: dict, keys: list[str], rows: int) -> None:
    """The entries `keys` of `state` (those present) cut to their first `rows` rows (views)."""
    for key in keys:
        if key in state and state[key].shape[0] > rows:
            state[key] = state[key][:rows]


def rows_padded(state: dict, keys: list[str], rows: int) -> None:
    """The entries `keys` of `state` (those present) with zero rows appended up to `rows`."""
    for key in keys:
        if key in state and state[key].shape[0] < rows:
            value = state[key]
            state[key] = torch.cat([value, value.new_zeros(rows - value.shape[0], *value.shape[1:])])


class BertEmbeddings(nn.Module, CheckpointLayout):
    """Token + segment + position embeddings, then LayerNorm and dropout (paper Fig. 2). With rotary positions there
    is no position table, and with `type_vocab_size` 0 no segment embeddings (ModernBERT).

    The word embeddings hold `padded_vocab(vocab_size)` rows, the vocabulary's and zero rows up to a multiple of 64
    (the MLM decoder shares them: its GEMM's rows aligned for tensor cores). No token id maps to a padding row, and
    the state dict holds the vocabulary's rows only (cut on save, padded with zeros on load: `CheckpointLayout`).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.vocab_size is None:  # a run's settings leave it to the tokenizer (run.building.with_vocabulary)
            raise ValueError("the model config's vocab_size is not set: give the tokenizer's vocabulary size")
        self.vocab_size = config.vocab_size
        rows = padded_vocab(config.vocab_size)
        self.word_embeddings = nn.Embedding(rows, config.hidden_size, padding_idx=config.pad_token_id)
        self._keep_checkpoint_layout()
        self.position_embeddings = (
            None if config.rotary else nn.Embedding(config.max_position_embeddings, config.hidden_size)
        )
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size else None
        )
        self.LayerNorm = layer_norm(config) if config.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`position_ids` (B, T): each token's position in its own example (packed rows); else 0..T-1."""
        seq_len = input_ids.shape[1]
        x = self.word_embeddings(input_ids)  # (B, T, H)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(seq_len, device=input_ids.device)  # (T,), broadcast over the batch
            x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))

    def to_checkpoint(self, state: dict, prefix: str) -> None:
        rows_cut(state, [f"{prefix}word_embeddings.weight"], self.vocab_size)

    def from_checkpoint(self, state: dict, prefix: str) -> None:
        rows_padded(state, [f"{prefix}word_embeddings.weight"], self.word_embeddings.num_embeddings)


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


class RotaryEmbedding(nn.Module):
    """Rotary position embeddings (RoPE, Su et al. 2021) as transformers' ModernBERT applies them: the head's
    dimensions in two halves, (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), at frequencies base^(-2i/D). One base
    for the global layers (`rope_theta`) and one for the sliding-window ones (`local_rope_theta`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        exponents = torch.arange(0, config.head_size, 2, dtype=torch.float) / config.head_size
        self.register_buffer("global_inv_freq", 1.0 / config.rope_theta**exponents, persistent=False)  # (D/2,)
        self.register_buffer("local_inv_freq", 1.0 / config.local_rope_theta**exponents, persistent=False)

    def forward(self, position_ids: torch.Tensor, local: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (..., D) for positions (...) (float32)."""
        inv_freq = self.local_inv_freq if local else self.global_inv_freq
        freqs = position_ids[..., None].float() * inv_freq  # (..., D/2)
        angles = torch.cat([freqs, freqs], dim=-1)  # (..., D)
        return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """x (..., H) rotated per head by (cos, sin) (..., D), computed in float32 as transformers does."""
    shape = x.shape
    dtype = x.dtype
    x = x.view(*shape[:-1], heads, shape[-1] // heads).float()  # (..., A, D)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos[..., None, :] + rotated * sin[..., None, :]).to(dtype).reshape(shape)


class BertSelfAttention(nn.Module, CheckpointLayout):
    """Bidirectional multi-head self-attention: every token attends to every real token.

    Query, key and value come from one fused projection `qkv` (H -> 3H, one GEMM instead of three, as in NVIDIA's
    and MosaicBERT's BERT). Its state dict keeps transformers' three names (`query`, `key`, `value`: split on save,
    joined on load: `CheckpointLayout`), so checkpoints still map one to one.
    """

    row_blocks: ClassVar[dict[str, int]] = {
        "qkv.weight": 3
    }  # LAMB's trust ratio: one per transformers' weight (lightbert.optim)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        # rows: query, key, value
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_probs_dropout_prob
        self._keep_checkpoint_layout()

    def forward(
        self,
        x: torch.Tensor,
        layout: Layout,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        """x is (B, T, H), or (N, H) where `layout` runs the layers on fewer tokens; the output has x's shape.
        `rotary`: (cos, sin) (x's leading shape, D) for the queries and keys; `window`: a sliding-window layer's
        reach on each side."""
        qkv = self.qkv(x)  # (..., 3H): query, key and value side by side; the layout splits them (views)
        if rotary is not None:  # the queries and keys rotated: one (..., 3H) tensor again, as the layouts take it
            q, k, v = qkv.chunk(3, -1)
            qkv = torch.cat([rotate(q, *rotary, self.num_heads), rotate(k, *rotary, self.num_heads), v], -1)
        return layout.attention(qkv, self.num_heads, self.dropout_p if self.training else 0.0, window)

    def to_checkpoint(self, state: dict, prefix: str) -> None:
        split_qkv(state, prefix)

    def from_checkpoint(self, state: dict, prefix: str) -> None:
        join_qkv(state, prefix)

    def probabilities(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, rotary: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """softmax(QK^T / sqrt(D)) (B, A, T, T): what the fused kernel computes inside, for looking at heads."""
        batch, seq_len, _ = x.shape
        q, k, _ = self.qkv(x).chunk(3, -1)
        if rotary is not None:
            q, k = rotate(q, *rotary, self.num_heads), rotate(k, *rotary, self.num_heads)
        q, k = (t.reshape(batch, seq_len, self.num_heads, self.head_size).transpose(1, 2) for t in (q, k))
        scores = q @ k.transpose(-1, -2) / self.head_size**0.5
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
        return scores.softmax(-1)


class BertSelfOutput(nn.Module):
    """Projection after attention, dropout, then the post-LN residual: LayerNorm(x + f(x)); pre-LN, x + f(x) (the
    norm came before, `BertLayer.attention_norm`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.LayerNorm = None if config.pre_norm else layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.dense(hidden)) + residual
        return out if self.LayerNorm is None else self.LayerNorm(out)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        return self.output(self.self(x, layout), x)


class BertIntermediate(nn.Module):
    """First feed-forward layer with the exact (erf) GELU the reference uses, not the tanh approximation; GeGLU
    (`mlp: geglu`): one (H, 2I) projection split as (input, gate), GELU(input) * gate."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.gated = config.mlp == "geglu"
        width = config.intermediate_size * (2 if self.gated else 1)
        self.dense = nn.Linear(config.hidden_size, width, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            inputs, gate = self.dense(x).chunk(2, dim=-1)
            return F.gelu(inputs) * gate  # (..., I)
        return F.gelu(self.dense(x))  # (..., I)


class BertOutput(BertSelfOutput):
    """Second feed-forward layer back to H, dropout, post-LN residual (pre-LN: the residual alone)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)


class BertLayer(nn.Module):
    """One Transformer block, post-LN (BERT) or pre-LN (`norm_position: pre`); also the unit FSDP wraps.

    Pre-LN: x + attention(attention_norm(x)), then x + mlp(mlp_norm(x)). Layer 0 of an encoder whose embeddings are
    normed has no attention norm (transformers' ModernBERT: the embeddings' norm is its input's)."""

    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)
        pre = config.pre_norm
        self.attention_norm = layer_norm(config) if pre and (index > 0 or not config.embedding_norm) else None
        self.mlp_norm = layer_norm(config) if pre else None
        self.window = None if config.is_global(index) else config.window
        self.local = self.window is not None

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.attention_norm is None else self.attention_norm(x)

    def forward(
        self, x: torch.Tensor, layout: Layout, rotary: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """x (B, T, H) or (N, H); `rotary`: this layer's (cos, sin) for x's tokens (`RotaryEmbedding`)."""
        x = self.attention.output(self.attention.self(self.attention_input(x), layout, rotary, self.window), x)
        mlp_input = x if self.mlp_norm is None else self.mlp_norm(x)
        return self.output(self.intermediate(mlp_input), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config, index) for index in range(config.num_hidden_layers))


class BertPooler(nn.Module):
    """Dense + tanh on the [CLS] position: the sentence representation the NSP and GLUE heads read. With
    `pooler: head` (ModernBERT's classifier head): [CLS] or the mean of the real tokens (`classifier_pooling`), then
    dense -> GELU -> LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.head = config.pooler == "head"
        self.mean = self.head and config.classifier_pooling == "mean"
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.head_bias if self.head else True)
        self.LayerNorm = layer_norm(config) if self.head else None

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        if self.LayerNorm is None:
            return torch.tanh(self.dense(x))
        return self.LayerNorm(F.gelu(self.dense(x)))

    def forward(
        self,
        sequence_output: torch.Tensor,
        last: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """From [CLS]; a left-to-right encoder's [CLS] sees only itself, so it reads each sequence's `last` real
        token instead (B,), as OpenAI GPT classifies from its final token. Mean pooling reads `attention_mask`
        (B, T) (None: every token)."""
        if self.mean:
            if attention_mask is None:
                return self.transform(sequence_output.mean(1))
            weights = attention_mask.to(sequence_output.dtype)[:, :, None]  # (B, T, 1)
            return self.transform((sequence_output * weights).sum(1) / weights.sum(1))
        if last is None:
            return self.transform(sequence_output[:, 0])  # (B, H)
        return self.transform(sequence_output[torch.arange(len(last), device=last.device), last])

    def at(self, sequence_output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """At several positions per row (B, K), e.g. each packed example's [CLS]: (B, K, H)."""
        index = positions[:, :, None].expand(-1, -1, sequence_output.shape[-1])
        return self.transform(sequence_output.gather(1, index))


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
        self.final_norm = layer_norm(config) if config.final_norm else None
        self.rotary = RotaryEmbedding(config) if config.rotary else None
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
        position_ids = packed.position_ids if packed is not None else None
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        hidden_states = [x] if output_hidden_states else None
        rotary = self.rotations(input_ids, position_ids, layout)
        x = layout.unpad(x)  # (N, H) where the layers skip padding
        for layer in self.encoder.layer:
            x = layer(x, layout, rotary[layer.local] if rotary is not None else None)
            if hidden_states is not None:
                hidden_states.append(layout.pad(x))
        if self.final_norm is not None:  # the output; hidden_states keep each layer's own, as transformers' do
            x = self.final_norm(x)
        x = layout.pad(x)  # (B, T, H)
        pooled = None
        if self.pooler is not None and packed is not None:  # every example's [CLS]; empty slots read position 0
            pooled = self.pooler.at(x, packed.cls_positions)  # (B, K, H)
        elif self.pooler is not None:
            pooled = self.pool(x, attention_mask, causal)
        return x, pooled, tuple(hidden_states) if hidden_states is not None else None

    def rotations(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None, layout: Layout | None = None
    ) -> dict[bool, tuple[torch.Tensor, torch.Tensor]] | None:
        """Rotary (cos, sin) for the global (False) and local (True) layers, each (N or B·T..., D) as the layers see
        the tokens under `layout` (None: (B, T, D)); None without rotary positions."""
        if self.rotary is None:
            return None
        batch, seq_len = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=input_ids.device).expand(batch, seq_len)  # (B, T)
        out = {}
        for local in {layer.local for layer in self.encoder.layer}:
            cos, sin = self.rotary(position_ids, local)  # (B, T, D)
            out[local] = (cos, sin) if layout is None else (layout.unpad(cos), layout.unpad(sin))
        return out

    def pool(self, x: torch.Tensor, attention_mask: torch.Tensor | None, causal: bool | None = None) -> torch.Tensor:
        """The pooler on `x` (B, T, H): at [CLS] (or the mean of the real tokens), or, left to right, at each
        sequence's last real token."""
        if not (self.config.causal if causal is None else causal):
            return self.pooler(x, attention_mask=attention_mask)
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
        rotary = self.rotations(input_ids, None)
        maps = []
        for layer in self.encoder.layer:
            turn = rotary[layer.local] if rotary is not None else None
            mask = with_window(attn_mask, input_ids.shape[1], layer.window, input_ids.device)
            maps.append(layer.attention.self.probabilities(layer.attention_input(x), mask, turn))
            x = layer(x, layout, turn)
        return tuple(maps)


class BertPredictionHeadTransform(nn.Module):
    """Dense -> GELU -> LayerNorm: the MLM head's first half (BERT's and ModernBERT's alike, biases per config), and
    the modern recipe's token-level heads' (`TokenHead`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.head_bias)
        self.LayerNorm = layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module, CheckpointLayout):
    """MLM head: transform, then a decoder whose weight is the word embedding matrix, with its own bias.

    The decoder computes a logit for each of the embeddings' padded rows (`BertEmbeddings`) and returns the
    vocabulary's only (a view, a shape fixed in advance): no padding row is ever predicted, none gets a gradient.
    """

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.vocab_size = config.vocab_size
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, word_embeddings.num_embeddings, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied: one (V, H) tensor (rows padded), as in the paper
        self.bias = nn.Parameter(torch.zeros(word_embeddings.num_embeddings))
        self._keep_checkpoint_layout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.transform(x), self.decoder.weight, self.bias)  # (..., padded V)
        return logits.narrow(-1, 0, self.vocab_size)  # (..., V), a view

    def to_checkpoint(self, state: dict, prefix: str) -> None:
        rows_cut(state, [f"{prefix}bias", f"{prefix}decoder.weight"], self.vocab_size)

    def from_checkpoint(self, state: dict, prefix: str) -> None:
        rows_padded(state, [f"{prefix}bias", f"{prefix}decoder.weight"], self.bias.shape[0])


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
        initialise(self, config, classifiers=(self.cls.seq_relationship,) if next_sentence else ())

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
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, BertEmbeddings):  # after its word embeddings (apply visits children first)
        with torch.no_grad():
            module.word_embeddings.weight[module.vocab_size :].zero_()  # the padding rows, which no token reads


def initialise(model: nn.Module, config: BertConfig, classifiers: tuple[nn.Linear, ...] = ()) -> None:
    """Draw the weights of `model` (an encoder and its heads, or any part) as `config.initializer` says: BERT's
    (`init_weights`) or ModernBERT's (`init_modernbert`). `classifiers` are the task's last layers, the ones ModernBERT
    draws wider ("final_out"); BERT draws them as every other layer."""
    if config.initializer == "modernbert":
        init_modernbert(model, config, classifiers)
        return
    model.apply(lambda module: init_weights(module, config.initializer_range))
    with torch.no_grad():  # a tied MLM decoder was re-drawn after its embedding (apply visits it later): zero again
        for embeddings in (m for m in model.modules() if isinstance(m, BertEmbeddings)):
            embeddings.word_embeddings.weight[config.pad_token_id].zero_()
            embeddings.word_embeddings.weight[embeddings.vocab_size :].zero_()


def init_modernbert(model: nn.Module, config: BertConfig, classifiers: tuple[nn.Linear, ...] = ()) -> None:
    """ModernBERT's initialisation ("full_megatron" in its repository's src/bert_layers/initialization.py), held to
    transformers' `ModernBertPreTrainedModel._init_weights` (tests/test_modern.py): each weight drawn from a normal
    truncated at +-initializer_cutoff_factor x its std, the std by the weight's role; biases zero, norms one.

    - "in", initializer_range: the token embeddings (ModernBERT's `tok_embeddings`; BERT's position and segment
      tables, which ModernBERT lacks, as its own code's positional "emb"), the fused Q/K/V (`Wqkv`) and the MLP's
      first layer (`Wi`, GeGLU's whole (H, 2I) projection);
    - "out", initializer_range / sqrt(2 L): the projections back into the residual stream, attention's and the
      MLP's (`Wo`), and the dense layer of every dense -> activation -> norm head (ModernBERT's `head.dense`): the
      MLM head's transform, the "head" pooler of the sentence-level heads, the token-level heads' `head` (and BERT's
      tanh pooler, its nearest role);
    - "final_out", in_features ** -0.5: `classifiers`, the task's last layer (hidden_size ** -0.5 in transformers'
      four task classes, whose classifiers read H; the feature-based tagger's reads its BiLSTM's 2 x width).

    The MLM decoder is tied to the token embeddings and keeps their "in" draw. transformers 5.24 draws its decoder
    with the "out" std, then ties it to the embeddings, so its tied tensor ends with the embeddings' std (measured:
    std 0.0176 = 0.02 x 0.88, the truncated normal's, and |w| up to 0.04 = 2 x 0.02, at H=256, L=4). [PAD]'s row is
    drawn like the others, as transformers and ModernBERT leave it (padding_idx keeps its gradient at zero); the
    rows past the vocabulary, lightbert's own, stay zero. LSTMs keep torch's default draw, as under BERT's init."""
    std = config.initializer_range
    stds: dict[nn.Module, float | None] = {}  # None: tied to a weight drawn elsewhere
    for module in model.modules():
        if isinstance(module, BertEmbeddings):
            for table in (module.word_embeddings, module.position_embeddings, module.token_type_embeddings):
                stds[table] = std
        elif isinstance(module, BertSelfAttention):
            stds[module.qkv] = std
        elif isinstance(module, BertIntermediate):
            stds[module.dense] = std
        elif isinstance(module, BertSelfOutput | BertPredictionHeadTransform | BertPooler):  # BertOutput included
            stds[module.dense] = std / math.sqrt(2.0 * config.num_hidden_layers)
        elif isinstance(module, BertLMPredictionHead):
            stds[module.decoder] = None
    for classifier in classifiers:
        stds[classifier] = classifier.in_features**-0.5
    cutoff = config.initializer_cutoff_factor
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, BertLMPredictionHead):
                nn.init.zeros_(module.bias)
            if not isinstance(module, nn.Linear | nn.Embedding):
                continue
            if module not in stds:
                raise TypeError(f"{name} ({type(module).__name__}) has no role in ModernBERT's initialisation")
            if stds[module] is not None:
                nn.init.trunc_normal_(module.weight, 0.0, stds[module], -cutoff * stds[module], cutoff * stds[module])
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for embeddings in (m for m in model.modules() if isinstance(m, BertEmbeddings)):
            embeddings.word_embeddings.weight[embeddings.vocab_size :].zero_()


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


def token_head(config: BertConfig) -> BertPredictionHeadTransform | None:
    """The modern recipe's token-level heads (`pooler: head`) run dense -> GELU -> LayerNorm on every token before
    their last layer, as transformers' ModernBertForTokenClassification and ...ForQuestionAnswering do; BERT's none."""
    return BertPredictionHeadTransform(config) if config.pooler == "head" else None


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
        initialise(self, config, classifiers=(self.classifier,))

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
        self.head = token_head(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        initialise(self, config, classifiers=(self.qa_outputs,))

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
        if self.head is not None:
            sequence_output = self.head(sequence_output)
        start_logits, end_logits = self.qa_outputs(sequence_output).unbind(-1)  # (B, T, 2) -> 2 x (B, T)
        return start_logits, end_logits


class BertForTokenClassification(nn.Module):
    """Encoder + dropout + one linear layer giving every token a label (paper §5.3, NER).

    Every sub-token gets logits; the task reads a word's label off its first sub-token. Names and the missing
    pooler match Hugging Face's class of the same name.
    """

    def __init__(self, config: BertConfig, num_labels: int, bilstm: bool = False):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.bilstm = SequenceBiLSTM(config) if bilstm else None
        self.head = token_head(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        initialise(self, config, classifiers=(self.classifier,))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sequence_output, _, _ = self.bert(input_ids, token_type_ids, attention_mask)
        if self.bilstm is not None:  # Table 5's + BiLSTM: right context for a left-to-right encoder
            sequence_output = self.bilstm(sequence_output, attention_mask)
        if self.head is not None:
            sequence_output = self.head(sequence_output)
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
        initialise(self, config, classifiers=(self.classifier,))

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
