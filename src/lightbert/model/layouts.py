"""Where a batch's tokens sit while the encoder's layers run on them, and how attention runs over them there.

`layout_for` picks one layout per forward pass from the padding mask, packed rows and `BertModel.unpad`; every
layer then calls its `unpad`, `pad` and `attention` (which takes the fused projection's output, query, key and value
side by side, (..., 3H)):

- `Padded`: the (B, T) rows as they are, attention under a mask (the padding's, or packed rows' (T, T) one).
- `RealTokensRepadded`, `RealTokensInGroups`, `RealTokensVarlen`: the layers run on the real tokens only, (N, H)
  instead of (B, T, H), the way MosaicBERT and NVIDIA's recipe skip padding; attention pads them back, runs in
  length groups each padded to its own longest, or runs through a variable-length kernel (`lightbert.model.varlen`).
- `PackedRowsVarlen`: packed rows flattened, attention within each example through the variable-length kernel.

Real tokens come out the same in every layout; padded positions come out as zeros where the layers skipped them.

Sliding-window (local) attention, the modern recipe's (`BertConfig.local_attention`): `attention(..., window=w)`
lets a token see only the keys at most w positions away, |i - j| <= w. On the padded layouts and length groups that
is one more (T, T) band in the mask, of fixed shape; through the variable-length kernel it is flash attention's own
window (`window_size_left` and `_right`), no mask at all. Packed rows' examples sit whole and in order in their row,
so the band over the row's positions is the band within each example.

Shapes: B rows in the batch, T tokens per row (padding included), H hidden size, A attention heads, D head size
(H / A), N tokens the layers run on (the batch's real tokens; B·T for packed rows), K example slots per packed row;
a length group has b rows of t tokens and n_g real ones.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from lightbert.model.varlen import Segments, varlen_attention

UNPADDING = ("off", "groups", "varlen")  # BertModel.unpad


class PackedRows(NamedTuple):
    """Where the examples of packed rows sit (`lightbert.tasks.pretraining.packing`): `document_ids` (B, T) each token's
    example in its row (1, 2, ...; 0 at padding), `position_ids` (B, T) its position within that example, and
    `cls_positions` (B, K) each example's [CLS] (0 for a row's empty slots)."""

    document_ids: torch.Tensor
    position_ids: torch.Tensor
    cls_positions: torch.Tensor


# -- masks -------------------------------------------------------------------------------------------------------


def document_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) example numbers of a packed row (1, 2, ...; 0 at padding) -> (B, 1, T, T) boolean mask: a token attends
    to the tokens of its own example only. Padding attends to padding, so no query row is fully masked."""
    return (document_ids[:, :, None] == document_ids[:, None, :])[:, None]


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 mask of real tokens -> (B, 1, 1, T) boolean mask of keys each query may attend to."""
    if attention_mask is None:
        return None
    return attention_mask.bool()[:, None, None, :]


def attention_mask_for(attention_mask: torch.Tensor | None, causal: bool) -> tuple[torch.Tensor | None, bool]:
    """The keys each query may attend to, as (mask, is_causal) for the attention kernel: the real ones (B, 1, 1, T)
    and, left to right, only those at or before the query.

    Left to right, when every sequence's padding is at its end (as every collator here pads), the kernel's causal
    mask alone is enough: a real query's keys at or before it are all real. That is (None, True): no (T, T) mask,
    the flash kernel on a GPU, and the length groups of unpadding still apply. Otherwise (left padding, holes) the
    full (B, 1, T, T) mask."""
    if causal and (attention_mask is None or padded_at_the_end(attention_mask)):
        return None, True
    if not causal:
        return padding_mask(attention_mask), False
    return explicit_attention_mask(attention_mask, attention_mask.shape[1], causal, attention_mask.device), False


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


def band(seq_len: int, window: int, device: torch.device) -> torch.Tensor:
    """(T, T) boolean: query i may see key j when |i - j| <= window (a sliding-window layer's keys)."""
    slots = torch.arange(seq_len, device=device)
    return (slots[:, None] - slots[None, :]).abs() <= window


def with_window(
    mask: torch.Tensor | None, seq_len: int, window: int | None, device: torch.device
) -> torch.Tensor | None:
    """`mask` ((B, 1, 1 or T, T) or None) and, with a `window`, its band: (B or 1, 1, T, T)."""
    if window is None:
        return mask
    near = band(seq_len, window, device)[None, None]  # (1, 1, T, T)
    return near if mask is None else mask & near


def padded_at_the_end(attention_mask: torch.Tensor) -> bool:
    """Whether each row of the (B, T) mask is its real tokens, then only padding."""
    slots = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return bool((attention_mask.bool() == (slots < attention_mask.sum(1, keepdim=True))).all())


# -- the layouts -------------------------------------------------------------------------------------------------


def padded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of q, k, v (B, T, H) over each row's keys under `mask` (None: every key) and, with `window`, only
    those at most `window` positions away -> (B, T, H)."""
    batch, seq_len, hidden = q.shape
    if window is not None and is_causal:  # the kernel takes a mask or is_causal, not both
        mask, is_causal = explicit_attention_mask(None, seq_len, True, q.device) if mask is None else mask, False
    mask = with_window(mask, seq_len, window, q.device)

    def split(t: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, A, T, D)
        return t.view(batch, seq_len, heads, hidden // heads).transpose(1, 2)

    # On CUDA a boolean mask rules out the flash kernel: cuDNN's attention takes it (what an H100 ran, torch 2.11),
    # or the memory-efficient kernel, in bf16 with dropout (it pads the mask's last dimension to its alignment
    # itself). No query row is fully masked (the mask hides keys, and every sequence has real tokens), so no kernel
    # meets the all-masked softmax that gives NaN.
    out = F.scaled_dot_product_attention(
        split(q), split(k), split(v), attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
    )
    return out.transpose(1, 2).reshape(batch, seq_len, hidden)  # (B, A, T, D) -> (B, T, H)


class Padded:
    """The (B, T) rows as they are, padding included: attention under `mask` ((B, 1, 1, T) padding, (B, 1, T, T)
    packed rows' documents or a left-to-right mask; None: every key) and, with `is_causal`, the kernel's own causal
    mask."""

    def __init__(self, mask: torch.Tensor | None = None, is_causal: bool = False):
        self.mask, self.is_causal = mask, is_causal

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def attention(self, qkv: torch.Tensor, heads: int, dropout_p: float, window: int | None = None):
        return padded_attention(*qkv.chunk(3, -1), heads, self.mask, dropout_p, self.is_causal, window)


class RealTokens:
    """Where the real tokens of a padded (B, T) batch sit, to move activations between (B, T, H) and (N, H). The
    subclasses say how attention runs on them."""

    def __init__(self, attention_mask: torch.Tensor):
        self.batch, self.seq_len = attention_mask.shape
        self.index = attention_mask.flatten().nonzero().squeeze(1)  # (N,) positions in the flattened batch

    def unpad(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (N, H)
        return x.flatten(0, 1).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:  # (N, H) -> (B, T, H), zeros at padding
        padded = x.new_zeros(self.batch * self.seq_len, x.shape[-1]).index_copy(0, self.index, x)
        return padded.view(self.batch, self.seq_len, -1)


class RealTokensRepadded(RealTokens):
    """Real tokens whose attention pads q, k, v back to (B, T, H) and attends as `Padded` would: for lengths that
    length groups would not pay for, and left to right over left padding or holes (groups carry padding masks only).
    """

    def __init__(self, attention_mask: torch.Tensor, mask: torch.Tensor | None, is_causal: bool):
        super().__init__(attention_mask)
        self.mask, self.is_causal = mask, is_causal

    def attention(self, qkv: torch.Tensor, heads: int, dropout_p: float, window: int | None = None):
        out = padded_attention(*self.pad(qkv).chunk(3, -1), heads, self.mask, dropout_p, self.is_causal, window)
        return self.unpad(out)


class LengthGroup(NamedTuple):
    """Sequences of similar length, attended to together: `gather` (b·t,) picks their real tokens' rows (row N is
    zeros, for padding), `mask` (b, 1, 1, t) their keys, `keep` (n_g,) the real rows of the output."""

    gather: torch.Tensor
    mask: torch.Tensor
    keep: torch.Tensor


class LengthGroups(NamedTuple):
    parts: list[LengthGroup]
    order: torch.Tensor  # (N,) the groups' outputs, concatenated, back to token order


def length_groups(attention_mask: torch.Tensor, max_groups: int = 4) -> LengthGroups | None:
    """Up to `max_groups` groups of sequences by length (equal counts, longest first), or None when grouping would
    save under 40% of attention's work (sum over groups of size x longest^2, against B x T^2): then the padded
    (B, T) layout is as good. Reads the lengths on the host (one sync, as unpadding itself needs)."""
    lengths = attention_mask.sum(1)
    counts = lengths.tolist()
    num_tokens = sum(counts)
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


class RealTokensInGroups(RealTokens):
    """Real tokens attending in length groups, each padded to its own longest (`length_groups`)."""

    def __init__(self, attention_mask: torch.Tensor, groups: LengthGroups, is_causal: bool):
        super().__init__(attention_mask)
        self.groups, self.is_causal = groups, is_causal

    def attention(self, qkv: torch.Tensor, heads: int, dropout_p: float, window: int | None = None):
        """Attention of the real tokens' qkv (N, 3H) -> (N, H), each length group padded to its own longest.

        The same result as attention over the (B, T) batch with the padding mask: every query attends to the real
        keys of its own sequence (left to right, `is_causal`: those at or before it; a group's padding is at the
        end of each row, so the causal mask alone keeps real queries off it). Attention's work grows with the
        square of the padded length, so a batch of mixed lengths (fine-tuning: SST-2's sentences are a third of
        their batch's longest) does a fraction of it.
        """
        hidden = qkv.shape[-1] // 3
        qkv = torch.cat([qkv, qkv.new_zeros(1, 3 * hidden)])  # (N + 1, 3H); row N pads
        outputs = []
        for group in self.groups.parts:
            b, t = group.mask.shape[0], group.mask.shape[-1]
            rows = qkv.index_select(0, group.gather).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            mask, causal = None if self.is_causal else group.mask, self.is_causal
            if window is not None:  # the kernel takes a mask or is_causal, not both
                mask = with_window(
                    explicit_attention_mask(None, t, True, qkv.device) if causal else mask, t, window, qkv.device
                )
                causal = False
            out = F.scaled_dot_product_attention(
                rows[0], rows[1], rows[2], attn_mask=mask, dropout_p=dropout_p, is_causal=causal
            )
            outputs.append(out.transpose(1, 2).reshape(b * t, hidden).index_select(0, group.keep))  # (n_g, H)
        return torch.cat(outputs).index_select(0, self.groups.order)  # back to the tokens' order


class RealTokensVarlen(RealTokens):
    """Real tokens attending through the variable-length kernel, each sequence's tokens as they are, in order: any
    padding, either direction (left to right, `is_causal`)."""

    def __init__(self, attention_mask: torch.Tensor, is_causal: bool):
        super().__init__(attention_mask)
        self.segments, self.is_causal = Segments.of_padded(attention_mask), is_causal

    def attention(self, qkv: torch.Tensor, heads: int, dropout_p: float, window: int | None = None):
        return varlen_attention(*qkv.chunk(3, -1), self.segments, heads, dropout_p, self.is_causal, window)


class PackedRowsVarlen:
    """Every token of packed rows (B, T), flattened: (B, T, H) <-> (B·T, H) are views, not copies, and attention runs
    through the variable-length kernel within each example (`Segments.of_packed_rows`; a row's padding attends to
    itself, and nobody reads it)."""

    def __init__(self, packed: PackedRows):
        self.batch, self.seq_len = packed.document_ids.shape
        self.segments = Segments.of_packed_rows(packed.document_ids, packed.cls_positions.shape[1])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B·T, H)
        return x.flatten(0, 1)

    def pad(self, x: torch.Tensor) -> torch.Tensor:  # (B·T, H) -> (B, T, H)
        return x.view(self.batch, self.seq_len, -1)

    def attention(self, qkv: torch.Tensor, heads: int, dropout_p: float, window: int | None = None):
        return varlen_attention(*qkv.chunk(3, -1), self.segments, heads, dropout_p, window=window)


Layout = Padded | RealTokensRepadded | RealTokensInGroups | RealTokensVarlen | PackedRowsVarlen


def layout_for(attention_mask: torch.Tensor | None, packed: PackedRows | None, unpad: str, causal: bool) -> Layout:
    """The layout for one forward pass: `attention_mask` (B, T) 1 at real tokens (None: no padding), `packed` rows
    (`PackedRows`) or None, `unpad` as `BertModel.unpad` (`UNPADDING`), `causal` the attention's direction.

    Packed rows read no host value (one graph under torch.compile); unpadding reads the mask on the host."""
    if packed is not None:
        if causal:
            raise ValueError("packed rows are for bidirectional encoders (a left-to-right model reads no [CLS])")
        if unpad == "varlen":
            return PackedRowsVarlen(packed)
        return Padded(document_mask(packed.document_ids))
    mask, is_causal = attention_mask_for(attention_mask, causal)
    if unpad == "off" or attention_mask is None or bool(attention_mask.all()):
        return Padded(mask, is_causal)
    if unpad == "varlen":
        return RealTokensVarlen(attention_mask, causal)
    # Length groups carry padding masks only: a left-to-right mask they cannot take (holes, left padding) is
    # applied over the padded batch.
    groups = length_groups(attention_mask) if is_causal or not causal else None
    if groups is None:
        return RealTokensRepadded(attention_mask, mask, is_causal)
    return RealTokensInGroups(attention_mask, groups, is_causal)
