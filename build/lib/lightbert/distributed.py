"""The few collective operations lightbert needs outside Lightning's own: one process group or none."""

from __future__ import annotations

import torch


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def gather_dict(part: dict) -> dict:
    """The union of every device's `part` (each holds its share of some keys); `part` itself on one device."""
    if not is_distributed():
        return part
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, part)
    return {k: v for rank_part in gathered for k, v in rank_part.items()}
