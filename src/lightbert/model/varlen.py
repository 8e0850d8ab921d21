"""Variable-length attention: the tokens of many sequences in one (N, A, D) tensor, each attending to
its own sequence only, the sequences given by their boundaries (`Segments.cu_seqlens`, as flash attention takes them).

This is `speed.unpad=varlen`: no padding anywhere, no (T, T) mask, one kernel call per layer. On a CUDA GPU in
bf16/fp16 the kernel is flash attention's variable-length one (`aten._flash_attention_forward` with cumulative
sequence lengths: the kernel `torch.nn.attention.varlen` wraps, called directly because that wrapper drops dropout,
and BERT trains with attention dropout). Elsewhere (a CPU, fp32) `segmentwise_attention` computes the same thing
one sequence at a time (on a CPU as fast as length groups, bench/RESULTS.md); the tests hold the model's varlen path
to the padded one through it, and so does a GPU that lacks flash's kernel (compute capability under 8.0, or a torch
built without flash attention): the fallback is said once per device.

The flash call is checked on CPU against CUDA's own meta kernels (fake CUDA tensors: its arguments, shapes and
backward); `pytest -m gpu` holds it to the mask path on a GPU. bench/RESULTS.md says what has run where.

Shapes (as in `lightbert.model.bert`): N tokens, H hidden size, A attention heads, D head size (H / A), S sequences,
n_s the tokens of sequence s.
"""

from __future__ import annotations

import itertools
import logging
from typing import NamedTuple

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


class Segments(NamedTuple):
    """Where each sequence's tokens sit among N: `cu_seqlens` (S + 1,) int32, 0 first and N last, sequence s at
    [cu_seqlens[s], cu_seqlens[s + 1]) (empty sequences allowed, so that the shape can be fixed); `max_len`: no
    sequence is longer (a bound, not a measurement: reading the longest would wait for the GPU)."""

    cu_seqlens: torch.Tensor
    max_len: int

    @classmethod
    def of_padded(cls, attention_mask: torch.Tensor) -> Segments:
        """The real tokens of a right-padded (B, T) batch, in order: B sequences."""
        lengths = attention_mask.sum(1, dtype=torch.int32)
        return cls(F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), attention_mask.shape[1])

    @classmethod
    def of_packed_rows(cls, document_ids: torch.Tensor, examples_per_row: int) -> Segments:
        """Every token of packed (B, T) rows, flattened row after row: in each row its `examples_per_row` example
        slots (document 1, 2, ...; an empty slot is an empty sequence) and then its padding as one more sequence,
        which attends to itself only. B x (K + 1) sequences whatever the rows hold: one shape, no host sync."""
        documents = torch.arange(1, examples_per_row + 1, device=document_ids.device)
        lengths = (document_ids[:, :, None] == documents).sum(1)  # (B, K): each example's tokens
        padding = document_ids.shape[1] - lengths.sum(1, keepdim=True)  # (B, 1): the rest of the row
        lengths = torch.cat([lengths, padding], 1).flatten()
        return cls(F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32), document_ids.shape[1])


# CUDA device index -> whether it runs flash's kernel. Filled outside compiled code (`flash_varlen_device`, called
# by the run's speed switches before compiling), so that a compiled step reads a dict and queries no device.
_FLASH_DEVICES: dict[int, bool] = {}
FLASH_MIN_CAPABILITY = (8, 0)  # flash attention's kernels: Ampere and later


def flash_varlen_device(index: int) -> bool:
    """Whether CUDA device `index` runs flash attention's variable-length kernel: compute capability 8.0 or later
    and a torch built with flash attention. Where not, the first call says so once, and varlen attention runs one
    sequence at a time there."""
    if index not in _FLASH_DEVICES:
        capability = torch.cuda.get_device_capability(index)
        built = torch.backends.cuda.is_flash_attention_available()
        _FLASH_DEVICES[index] = capability >= FLASH_MIN_CAPABILITY and built
        if not _FLASH_DEVICES[index]:
            why = "this torch is built without flash attention" if not built else (
                f"{torch.cuda.get_device_name(index)} is compute capability {capability[0]}.{capability[1]}, "
                f"flash needs {FLASH_MIN_CAPABILITY[0]}.{FLASH_MIN_CAPABILITY[1]}"
            )  # fmt: skip
            log.warning(f"varlen attention runs one sequence at a time on cuda:{index}: {why}")
    return _FLASH_DEVICES[index]


def flash_varlen_supported(q: torch.Tensor) -> bool:
    """Whether flash attention's variable-length kernel takes q (N, A, D): bf16/fp16, a head size it has, on a CUDA
    device that has the kernel (`flash_varlen_device`)."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
        and flash_varlen_device(q.device.index if q.device.index is not None else torch.cuda.current_device())
    )


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: Segments,
    heads: int,
    dropout_p: float,
    is_causal: bool = False,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of the tokens q, k, v (N, H) within their own sequences -> (N, H); `is_causal`: each token attends
    to those at or before it in its sequence (the order of the N); `window`: only to those at most `window` positions
    away (a sliding-window layer; flash's `window_size_left` and `_right`, both ends included)."""
    n, hidden = q.shape
    q, k, v = (t.view(n, heads, hidden // heads) for t in (q, k, v))  # views: the Linear outputs as they are
    if flash_varlen_supported(q):
        cu, longest = segments.cu_seqlens, segments.max_len
        sides = {} if window is None else {"window_size_left": window, "window_size_right": window}
        out = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, longest, longest, dropout_p, is_causal, False, **sides
        )[0]
    else:
        out = segmentwise_attention(q, k, v, segments.cu_seqlens, dropout_p, is_causal, window)
    return out.reshape(n, hidden)


def segmentwise_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    window: int | None = None,
) -> torch.Tensor:
    """q, k, v (N, A, D) -> (N, A, D), one scaled_dot_product_attention call per non-empty sequence (`window`: within
    a band of that half-width). Reads the boundaries on the host."""
    bounds = cu_seqlens.tolist()
    outputs = []
    for start, end in itertools.pairwise(bounds):
        if end > start:
            parts = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (A, n_s, D)
            mask, causal = None, is_causal
            if window is not None:  # the kernel takes a mask or is_causal, not both
                slots = torch.arange(end - start, device=q.device)
                mask = (slots[:, None] - slots[None, :]).abs() <= window  # (n_s, n_s)
                mask, causal = (mask.tril(), False) if is_causal else (mask, False)
            out = F.scaled_dot_product_attention(*parts, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
            outputs.append(out.transpose(0, 1))
    return torch.cat(outputs)
