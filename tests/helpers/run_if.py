"""`@RunIf(...)`: a test marked `gpu` that runs only where the hardware it needs is there, and otherwise skips with
the reason (as litgpt's `RunIf` and lightning-hydra-template's `tests/helpers/run_if.py` do). `pytest -m gpu` runs
them all on a GPU machine; without CUDA each one skips."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def RunIf(*, min_cuda_gpus: int = 1, min_capability: tuple[int, int] | None = None, flash: bool = False) -> Callable:  # noqa: N802
    """Marks a test `gpu` and skips it without `min_cuda_gpus` CUDA devices, without compute capability
    `min_capability` on the first, or (`flash`) without flash attention's kernels (capability 8.0, a torch built
    with them)."""
    reasons = []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < min_cuda_gpus:
        reasons.append(f"needs {min_cuda_gpus} CUDA GPU(s), {count} here")
    elif min_capability is not None and torch.cuda.get_device_capability(0) < min_capability:
        reasons.append(f"needs compute capability {min_capability[0]}.{min_capability[1]}")
    elif flash:
        from lightbert.model.varlen import flash_varlen_device

        if not flash_varlen_device(0):
            reasons.append("needs flash attention's kernels")

    def mark(test: Callable) -> Callable:
        return pytest.mark.gpu(pytest.mark.skipif(bool(reasons), reason="; ".join(reasons))(test))

    return mark
