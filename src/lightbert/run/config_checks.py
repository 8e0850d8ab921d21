"""The composed config checked as a whole, before the typed settings are built from it (`run.settings`): it
resolves, it holds every part a run reads, and every number in it is of its kind, checked once in one pass over one
table (`NUMBERS`). A bad value is one message naming the key the command line accepts, before anything is read or
written. Torch-free, as the settings are."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import GrammarParseError, InterpolationResolutionError

from lightbert.errors import ConfigError


@dataclass(frozen=True)
class CheckedConfig:
    """The composed config once checked, what `RunSettings.from_config` is built from: `config` is a copy of it that
    holds each checked value as checked (`with_checked_values`), `numbers` those values by key."""

    config: DictConfig
    numbers: dict[str, Any]


def checked_config(cfg: DictConfig) -> CheckedConfig:
    """Refuses a config that does not resolve or lacks a part a run reads; returns it with its numbers checked, each
    value checked once here and handed on as checked."""
    _check_whole(cfg)
    numbers = checked_numbers(cfg)
    return CheckedConfig(with_checked_values(cfg, numbers), numbers)


# Every number of a run's config, checked once (`checked_numbers`) before any part of the settings is built: key ->
# what `checked_number` allows (kind, smallest value, null, "auto", ...). A key the config does not hold keeps its
# part's default, but for REQUIRED_NUMBERS. How values go together is their part's to check (`OptimConfig`: a warmup
# shorter than the run, one decay schedule).
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
    "task.scale": {"kind": float, "positive": True},  # task=embedding: 1 / temperature
    "task.mini_batch_size": {"kind": int, "minimum": 1, "nullable": True},  # task=embedding: GradCache's
    "task.datamodule.eval_batch_size": {"kind": int, "minimum": 1, "nullable": True},
    "task.datamodule.dupe_factor": {"kind": int, "minimum": 1},
    "task.datamodule.max_predictions_per_seq": {"kind": int, "minimum": 1, "nullable": True},  # null: from the rate
    "task.datamodule.num_workers": {"kind": int, "minimum": 0, "or_auto": True},  # auto: by the machine
    "task.datamodule.vocab_size": {"kind": int, "minimum": 1},
    # A share of the training batches between two validations (pre-training); null reads the whole held-out split.
    "task.datamodule.validation_share": {"kind": float, "positive": True, "largest": 1, "nullable": True},
    "optim.lr": {"kind": float, "positive": True},
    "optim.weight_decay": {"kind": float},
    # Added to the root of Adam's second moment before it divides: 0 divides 0 by 0 for a weight without gradient
    # (the loss is NaN within steps), and below 0 the step can change sign. optim.betas, a pair: `OptimConfig`.
    "optim.eps": {"kind": float, "positive": True},
    "optim.warmup_ratio": {"kind": float},  # and < 1 (`OptimConfig`)
    "optim.warmup_steps": {"kind": int, "nullable": True},  # null: from warmup_ratio
    "optim.decay_power": {"kind": float, "positive": True, "nullable": True},
    "optim.decay_ratio": {"kind": float, "positive": True, "nullable": True},  # and <= 1 (`OptimConfig`)
}
REQUIRED_NUMBERS = ("seed", "task.batch_size")
ABSENT = object()


def checked_numbers(cfg: DictConfig) -> dict[str, Any]:
    """Each number of NUMBERS the config holds, as its kind, or one message naming its key; add_words as a count of
    words or a file of them (`checked_add_words`); and the values each of `task.phases` sets (`checked_phases`)."""
    checked = {}
    for key, allowed in NUMBERS.items():
        value = OmegaConf.select(cfg, key, default=ABSENT)
        if value is not ABSENT or key in REQUIRED_NUMBERS:
            checked[key] = checked_number(key, None if value is ABSENT else value, **allowed)
    add = OmegaConf.select(cfg, ADD_WORDS, default=ABSENT)
    if add is not ABSENT:
        checked[ADD_WORDS] = checked_add_words(ADD_WORDS, add)
    checked |= checked_phases(cfg)
    return checked


ADD_WORDS = "task.datamodule.add_words"


def checked_add_words(key: str, value: Any) -> int | str | None:
    """add_words as the run uses it: None, a count (an int: `1e3`, `10.0` and `'40'` are counts too, as anything
    that reads as a whole number is), or the path of a file of words (any other text; a file named like a number is
    given as ./40). A count that is not whole, or below 0, is one message naming `key`."""
    if value is None:
        return None
    text = value.strip() if isinstance(value, str) else None
    if text is not None and as_number(text, float) is None:
        if not text:
            raise ConfigError(f"{key} is empty: give a count of words (e.g. {key}=2000) or a file of words, one a line")
        return text
    count = as_number(value, int)
    if count is None or count < 0:
        raise ConfigError(f"{key} must be a count of words (0 or more) or a file of words, got {value!r}")
    return int(count)


def checked_number(
    key: str,
    value: Any,
    kind: type = int,
    minimum: float = 0,
    nullable: bool = False,
    positive: bool = False,
    largest: float | None = None,
    or_auto: bool = False,
) -> Any:
    """`value` as a `kind`, or one message naming `key`: a value of the wrong kind or out of range fails here, not in
    a traceback from deep in Lightning or the data code (`trainer.max_steps=abc`, `task.batch_size=0`)."""
    if (value is None and nullable) or (or_auto and value == "auto"):
        return value
    number = as_number(value, kind)
    if number is None:
        what = ("an integer" if kind is int else "a number") + (" or auto" if or_auto else "")
        raise ConfigError(f"{key} must be {what}, got {value!r}")
    if number < minimum or (positive and number <= 0) or (largest is not None and number > largest):
        bound = "> 0" if positive else f">= {minimum:g}"
        if largest is not None:
            bound = f"from {minimum:g} to {largest:.0f}" if largest != 1 else f"{bound} and <= 1"
        raise ConfigError(f"{key} must be {bound}, got {value!r}")
    return kind(number)


def as_number(value: Any, kind: type) -> float | None:
    """`value` as a number of `kind` (a text that reads as one too: `'1e3'`), or None: a bool, a non-finite number, a
    fraction where an int is asked for."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if kind is int and value != int(value):
        return None
    return value


# task.datamodule keys a phase cannot change: the vocabulary is made once, before the first phase, and every phase
# reads the run's tokenizer (a phase's own would be ignored).
ONCE_PER_RUN = {
    "add_words": "the words are added once, before the first phase: set task.datamodule.add_words",
    "tokenizer_path": "every phase reads the run's tokenizer: set task.datamodule.tokenizer_path",
    "vocab_size": "the vocabulary is trained once, before the first phase: set task.datamodule.vocab_size",
    "lowercase": "every phase reads the run's tokenizer: set task.datamodule.lowercase",
}


def checked_phases(cfg: DictConfig) -> dict[str, Any]:
    """The values each of `task.phases` sets, checked as the same keys of task.datamodule are (NUMBERS, by the key
    itself or the key it interpolates: a phase's max_seq_length is task.max_seq_length's kind), before anything is
    written, and not when the phase starts after the ones before it trained: `task.phases[1].datamodule.<key>` ->
    its value as its kind. A key task.datamodule does not have, or one a phase cannot change, is one message."""
    phases = OmegaConf.select(cfg, "task.phases", default=None)
    datamodule = OmegaConf.select(cfg, "task.datamodule", default=None)
    if not phases or not OmegaConf.is_list(phases) or not OmegaConf.is_dict(datamodule):
        return {}  # not a list of phases: run.phases.phases_of says what a phase must be
    valid = sorted(str(k) for k in datamodule if k != "_target_")
    checked = {}
    for number, phase in enumerate(phases):
        changes = phase.get("datamodule") if OmegaConf.is_dict(phase) else None
        if not OmegaConf.is_dict(changes):
            continue
        for name in changes:
            key = f"task.phases[{number}].datamodule.{name}"
            if name in ONCE_PER_RUN:
                raise ConfigError(f"{key}: a phase cannot change it; {ONCE_PER_RUN[name]} (for the whole run)")
            if name not in valid:
                raise ConfigError(
                    f"{key}: {name} is not a key of task.datamodule, so no phase can change it; valid: "
                    f"{', '.join(valid)}"
                )
            rule = NUMBERS.get(_configured_key(datamodule, str(name)))
            if rule is not None:
                checked[key] = checked_number(key, changes[name], **rule)
    return checked


def _configured_key(datamodule: DictConfig, name: str) -> str:
    """The key a user sets for task.datamodule's `name`: the one it interpolates (`max_seq_length:
    ${task.max_seq_length}`), else its own."""
    raw = OmegaConf.to_container(datamodule, resolve=False).get(name)
    match = re.fullmatch(r"\$\{([\w.]+)\}", raw) if isinstance(raw, str) else None
    return match.group(1) if match else f"task.datamodule.{name}"


def with_checked_values(cfg: DictConfig, checked: dict[str, Any]) -> DictConfig:
    """A copy of `cfg` holding each checked value as checked (`1e3` as 1000, `'20'` as 20), so that what the run
    builds from the config (the DataModule, the Trainer, a phase's data) is the value that passed the check; a value
    already of its kind is left as it is (an interpolation stays one), and so is an int where a number is asked for.
    `cfg` itself is not changed."""
    converted = copy.deepcopy(cfg)
    for key, value in checked.items():
        phase = re.fullmatch(r"task\.phases\[(\d+)\]\.datamodule\.(\w+)", key)
        if phase:
            node, name = converted.task.phases[int(phase.group(1))].datamodule, phase.group(2)
        else:
            path, _, name = key.rpartition(".")
            node = OmegaConf.select(converted, path) if path else converted
        if node is None or name not in node:
            continue  # a key the config does not hold keeps its part's default
        given = node[name]
        # An int stays one where a number is asked for: Lightning reads trainer.val_check_interval=4 as batches, 4.0 as
        # a share of the epoch.
        whole = isinstance(given, int) and not isinstance(given, bool) and isinstance(value, float)
        if not whole and (type(given) is not type(value) or given != value):
            with open_dict(node):
                node[name] = value
    return converted


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
