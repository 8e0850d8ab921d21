"""The optimiser's settings (the config's `optim` node), typed. Light to import (no torch): a run's settings hold them,
and a bad value is refused before torch loads: each number's kind and range where the run's numbers are checked
(`run.config_checks.NUMBERS`), how they go together here. `lightbert.optim` builds the optimiser from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from lightbert.errors import ConfigError

OPTIMIZERS = {"adamw", "lamb", "stableadamw"}


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"  # adamw | lamb | stableadamw
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    # Fully decoupled weight decay (adamw, stableadamw): weight_decay x (scheduled lr / lr) a step, not lr x it.
    decouple_lr: bool = False
    warmup_ratio: float = 0.01
    warmup_steps: int | None = None  # when set, overrides warmup_ratio
    fused: bool | None = None  # None: the fused kernel where torch has one for the device (CPU, CUDA)
    decay_power: float | None = None  # None: linear decay from the end of warmup; else NVIDIA's (1 - step/total)^p
    # Warmup-stable-decay: the rate held at its peak after warmup, then a 1-sqrt decay to 0 over this last share of
    # the steps (ModernBERT's trapezoidal schedule); None: decay from the end of warmup (the paper's).
    decay_ratio: float | None = None
    total_steps: int | None = None  # the schedule's length; None: the trainer's (a recipe spans several phases)

    def __post_init__(self) -> None:
        """How the values go together, checked here, naming their config keys: a run's settings are refused before
        anything is written (`RunSettings.optim`), and a module read back from a checkpoint is held to the same rules.
        Each number's kind and range is checked once, where the run's numbers are (`run.config_checks.NUMBERS`)."""
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name {self.name!r} is not known; valid: {sorted(OPTIMIZERS)}")
        if not isinstance(self.decouple_lr, bool):
            raise ConfigError(f"optim.decouple_lr must be true or false, got {self.decouple_lr!r}")
        if self.decouple_lr and self.name == "lamb":  # LAMB's decay is inside the step its trust ratio scales
            raise ConfigError("optim.decouple_lr is for adamw and stableadamw; set optim.decouple_lr=false with lamb")
        # A pair, not one number, so checked here rather than in NUMBERS: each the decay rate of one of Adam's
        # moments, in [0, 1). At 1 Adam's bias correction 1 - beta^t divides by zero at step 1; above, the moments grow
        # without bound.
        betas = self.betas
        numbers = isinstance(betas, list | tuple) and all(
            isinstance(b, int | float) and not isinstance(b, bool) for b in betas
        )
        if not numbers or len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ConfigError(
                f"optim.betas must be two numbers, each >= 0 and < 1 (e.g. optim.betas=[0.9,0.999]), got {betas!r}"
            )
        if self.warmup_ratio >= 1:  # no step would be left to decay over
            raise ConfigError(f"optim.warmup_ratio must be >= 0 and < 1, got {self.warmup_ratio!r}")
        if self.decay_ratio is not None and self.decay_ratio > 1:
            raise ConfigError(f"optim.decay_ratio is a share of the steps, in (0, 1]; got {self.decay_ratio!r}")
        if self.decay_ratio is not None and self.decay_power is not None:
            raise ConfigError(
                "optim.decay_ratio (warmup-stable-decay) and optim.decay_power (polynomial decay) are two schedules: "
                "set one of them"
            )

    @classmethod
    def from_config(cls, values: dict[str, Any]) -> OptimConfig:
        """From the config's `optim` node; a key that is no optimiser setting is named with the valid ones."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            valid = ", ".join(f.name for f in fields(cls))
            raise ConfigError(f"optim.{unknown[0]} is not an optimiser setting; valid: {valid}")
        return cls(**values)

    def hyperparameters(self) -> dict[str, Any]:
        """The values as a LightningModule records them (plain types: betas as a list, as the config gives it)."""
        return {**asdict(self), "betas": list(self.betas)}

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else round(self.warmup_ratio * total_steps)
