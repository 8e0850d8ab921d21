"""The optimiser's settings (the config's `optim` node), typed. Light to import (no torch): a run's settings hold them,
and a bad value is refused before torch loads: each number's kind and range on its field (`settings_fields`), from
which the run's checks are built (`run.config_checks.NUMBERS`), how they go together here. `lightbert.optim` builds the
optimiser from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lightbert.errors import ConfigError
from lightbert.settings_fields import Number, check_fields, required, setting

OPTIMIZERS = {"adamw", "lamb", "stableadamw"}


# The optimisers' recipes, the defaults of every optimiser setting: conf/optim/<name>.yaml (`OptimConfig.recipe`).
OPTIM_CONF = Path(__file__).resolve().parent / "conf" / "optim"


@dataclass(frozen=True)
class OptimConfig:
    """The optimiser's settings. Each field's kind and range is here, once (`setting(number=...)`); its default is the
    YAML's (conf/optim/<name>.yaml sets every one; `recipe` reads them for code that builds one itself)."""

    name: str = setting()  # adamw | lamb | stableadamw
    lr: float = setting(number=Number(float, positive=True))
    # Each the decay rate of one of Adam's moments: at 1 Adam's bias correction 1 - beta^t divides by zero at step 1;
    # above, the moments grow without bound.
    betas: tuple[float, float] = setting(number=Number(float, below=1, items=2, example="[0.9,0.999]"))
    # Added to the root of Adam's second moment before it divides: 0 divides 0 by 0 for a weight without gradient
    # (the loss is NaN within steps), and below 0 the step can change sign.
    eps: float = setting(number=Number(float, positive=True))
    weight_decay: float = setting(number=Number(float))
    # Fully decoupled weight decay (adamw, stableadamw): weight_decay x (scheduled lr / lr) a step, not lr x it.
    decouple_lr: bool = setting()
    warmup_ratio: float = setting(number=Number(float, below=1))  # below 1: steps are left to decay over
    warmup_steps: int | None = setting(number=Number(int, nullable=True))  # when set, overrides warmup_ratio
    fused: bool | None = setting()  # None: the fused kernel where torch has one for the device (CPU, CUDA)
    # None: linear decay from the end of warmup; else NVIDIA's (1 - step/total)^p.
    decay_power: float | None = setting(number=Number(float, positive=True, nullable=True))
    # Warmup-stable-decay: the rate held at its peak after warmup, then a 1-sqrt decay to 0 over this last share of
    # the steps (ModernBERT's trapezoidal schedule); None: decay from the end of warmup (the paper's).
    decay_ratio: float | None = setting(number=Number(float, positive=True, largest=1, nullable=True))
    # The schedule's length; None: the trainer's (a recipe spans several phases).
    total_steps: int | None = setting(number=Number(int, minimum=1, nullable=True))

    def __post_init__(self) -> None:
        """Each number against its field's range, and how the values go together, naming their config keys: a run's
        settings are refused before anything is written (`RunSettings.optim`), and a module read back from a
        checkpoint is held to the same rules."""
        check_fields(self, "optim")
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name {self.name!r} is not known; valid: {sorted(OPTIMIZERS)}")
        if not isinstance(self.decouple_lr, bool):
            raise ConfigError(f"optim.decouple_lr must be true or false, got {self.decouple_lr!r}")
        if self.decouple_lr and self.name == "lamb":  # LAMB's decay is inside the step its trust ratio scales
            raise ConfigError("optim.decouple_lr is for adamw and stableadamw; set optim.decouple_lr=false with lamb")
        if self.decay_ratio is not None and self.decay_power is not None:
            raise ConfigError(
                "optim.decay_ratio (warmup-stable-decay) and optim.decay_power (polynomial decay) are two schedules: "
                "set one of them"
            )

    @classmethod
    def recipe(cls, name: str = "adamw", **values: Any) -> OptimConfig:
        """An optimiser's settings as conf/optim/<name>.yaml sets them, with `values` over them: what code that builds
        one without a run's config starts from (a test, a module read from an older checkpoint). lr and
        warmup_ratio, which the YAML leaves to the task, must be among `values`."""
        path = OPTIM_CONF / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"optim.name {name!r} is not known; valid: {sorted(OPTIMIZERS)}")
        recipe = OmegaConf.load(path)
        given = {str(k): v for k, v in OmegaConf.to_container(recipe).items() if v != "???"}  # ???: the task's
        return cls.from_config({**given, **values})

    @classmethod
    def from_config(cls, values: dict[str, Any]) -> OptimConfig:
        """From the config's `optim` node; a key that is no optimiser setting is named with the valid ones."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            valid = ", ".join(f.name for f in fields(cls))
            raise ConfigError(f"optim.{unknown[0]} is not an optimiser setting; valid: {valid}")
        missing = [f.name for f in fields(cls) if required(f) and f.name not in values]
        if missing:
            raise ConfigError(f"optim.{missing[0]} is not set: every optimiser setting is, e.g. optim.{missing[0]}=...")
        return cls(**values)

    def hyperparameters(self) -> dict[str, Any]:
        """The values as a LightningModule records them (plain types: betas as a list, as the config gives it)."""
        return {**asdict(self), "betas": list(self.betas)}

    def warmup(self, total_steps: int) -> int:
        return self.warmup_steps if self.warmup_steps is not None else round(self.warmup_ratio * total_steps)
