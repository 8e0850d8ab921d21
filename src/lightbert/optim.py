"""Optimisers and learning-rate schedules shared by every task.

AdamW as in the paper's Appendix A.2 (beta1 0.9, beta2 0.999, weight decay 0.01), with no decay on biases
and LayerNorm weights (the reference's `exclude_from_weight_decay`), linear warmup then linear decay to 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lightbert.errors import ConfigError


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_ratio: float = 0.01
    warmup_steps: int | None = None  # when set, overrides warmup_ratio
    fused: bool | None = None  # None: the fused kernel where torch has one for the device (CPU, CUDA)

    def __post_init__(self) -> None:
        if self.name != "adamw":
            raise ConfigError(f"optim.name {self.name!r} is not known; valid: ['adamw']")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be positive, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else round(self.warmup_ratio * total_steps)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices decay; biases and LayerNorm weights (every 1-d parameter) do not."""
    decay, no_decay = [], []
    for parameter in model.parameters():  # tied weights appear once
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: 0 -> 1 over the warmup, then linearly down to 0 at `total_steps`.

    The same numbers as the reference's warmup + polynomial decay (power 1) and transformers'
    `get_linear_schedule_with_warmup`: the first step has lr 0 when there is a warmup.
    """

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def build_optimizer(model: nn.Module, config: OptimConfig, total_steps: int) -> dict:
    """What `LightningModule.configure_optimizers` returns: the optimiser and a per-step scheduler."""
    fused = config.fused
    if fused is None:  # one kernel for all tensors: faster than foreach on CPU too (bench/RESULTS.md)
        fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    optimizer = torch.optim.AdamW(
        parameter_groups(model, config.weight_decay),
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        fused=fused,
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_decay(config.warmup(total_steps), total_steps)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
