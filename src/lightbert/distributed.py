"""The few collective operations lightbert needs outside Lightning's own (one process group or none), and whether a
run is on CUDA at all."""

from __future__ import annotations

import torch


def runs_on_cuda(accelerator: str) -> bool:
    """Whether a trainer with this `trainer.accelerator` runs on CUDA GPUs here (auto: when there is one)."""
    return accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_dict(part: dict) -> dict:
    """The union of every device's `part` (each holds its share of some keys); `part` itself on one device."""
    if not is_distributed():
        return part
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, part)
    return {k: v for rank_part in gathered for k, v in rank_part.items()}
