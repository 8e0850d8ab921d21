"""The composed config checked as a whole, before the typed settings are built from it (`run.settings`): it
resolves, it holds every part a run reads, and every number in it is of its kind, checked once in one pass over one
table (`NUMBERS`). A bad value is one message naming the key the command line accepts, before anything is read or
written. Torch-free, as the settings are."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError

from lightbert.errors import ConfigError, as_number, checked_number


def checked_config(cfg: DictConfig) -> dict[str, Any]:
    """Refuses a config that does not resolve or lacks a part a run reads; returns its numbers, checked
    (`RunSettings.from_config` takes them)."""
    _check_whole(cfg)
    return checked_numbers(cfg)


# Every number of a run's config, checked once (`checked_numbers`) before any part of the settings is built: key ->
# what `lightbert.errors.checked_number` allows (kind, smallest value, null, "auto", ...). A key the config does not
# hold keeps its part's default, but for REQUIRED_NUMBERS. (The optimiser's are `OptimConfig`'s.)
NUMBERS = {
    "seed": {"kind": int, "largest": 2**32 - 1},  # numpy's and Python's seeds
    "trainer.max_steps": {"kind": int, "minimum": -1},
    "trainer.max_epochs": {"kind": int, "minimum": -1, "nullable": True},
    "trainer.accumulate_grad_batches": {"kind": int, "minimum": 1},
    "trainer.log_every_n_steps": {"kind": int, "minimum": 1},
    "trainer.num_nodes": {"kind": int, "minimum": 1},
    "trainer.gradient_clip_val": {"kind": float, "nullable": True},
    "trainer.val_check_interval": {"kind": float, "positive": True, "nullable": True},
    "task.batch_size": {"kind": int, "minimum": 1},
    "task.global_batch_size": {"kind": int, "minimum": 1, "nullable": True},
    "task.max_seq_length": {"kind": int, "minimum": 1, "nullable": True},
    "task.checkpoint_every_n_steps": {"kind": int, "minimum": 1, "nullable": True},
    "task.cpu_val_check_interval": {"kind": int, "minimum": 1, "nullable": True},
    "task.datamodule.eval_batch_size": {"kind": int, "minimum": 1, "nullable": True},
    "task.datamodule.dupe_factor": {"kind": int, "minimum": 1},
    "task.datamodule.max_predictions_per_seq": {"kind": int, "minimum": 1, "nullable": True},  # null: from the rate
    "task.datamodule.num_workers": {"kind": int, "minimum": 0, "or_auto": True},  # auto: by the machine
    "task.datamodule.vocab_size": {"kind": int, "minimum": 1},
    # A share of the training batches between two validations (pre-training); null reads the whole held-out split.
    "task.datamodule.validation_share": {"kind": float, "positive": True, "largest": 1, "nullable": True},
}
REQUIRED_NUMBERS = ("seed", "task.batch_size")
ABSENT = object()


def checked_numbers(cfg: DictConfig) -> dict[str, Any]:
    """Each number of NUMBERS the config holds, as its kind, or one message naming its key; and add_words, a count
    of words or a file of them."""
    checked = {}
    for key, allowed in NUMBERS.items():
        value = OmegaConf.select(cfg, key, default=ABSENT)
        if value is not ABSENT or key in REQUIRED_NUMBERS:
            checked[key] = checked_number(key, None if value is ABSENT else value, **allowed)
    add = OmegaConf.select(cfg, "task.datamodule.add_words")
    if add is not None and not isinstance(add, str) and (as_number(add, int) is None or add < 0):
        raise ConfigError(
            f"task.datamodule.add_words must be a count of words (0 or more) or a file of words, got {add!r}"
        )
    return checked


# The parts every run reads, each with a key it cannot be without: removing one (`~trainer`) leaves nothing to run.
REQUIRED = {
    "model": "model.hidden_size",
    "task": "task.name",
    "task.datamodule": "task.datamodule._target_",
    "task.module": "task.module._target_",
    "trainer": "trainer._target_",
    "optim": "optim.lr",
    "paths": "paths.output_dir",
}


def _check_whole(cfg: DictConfig) -> None:
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except (InterpolationResolutionError, GrammarParseError) as error:
        key = getattr(error, "full_key", None) or "a value"
        reason = str(error).splitlines()[0]
        raise ConfigError(
            f"{key} cannot be resolved ({reason}); an interpolation ${{...}} there refers to itself or to a key "
            "that does not exist: give the value itself"
        ) from None
    for key, inner in REQUIRED.items():
        if OmegaConf.select(cfg, inner, default=None) is None:
            raise ConfigError(f"the config has no {key} (an override ~{key}?); every run needs it: drop that override")
