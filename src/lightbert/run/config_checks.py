"""The composed config checked as a whole, before the typed settings are built from it (`run.settings`): it
resolves, it holds every part a run reads, and every number in it is of its kind, checked once in one pass over one
table (`NUMBERS`, read from the settings' fields). A bad value is one message naming the key the command line
accepts, before anything is read or written. Torch-free, as the settings are."""

from __future__ import annotations

import copy
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import GrammarParseError, InterpolationResolutionError

from lightbert.errors import ConfigError
from lightbert.optim_config import OptimConfig
from lightbert.run.settings import CheckedConfig, RunSettings, TaskSettings, TrainerSettings
from lightbert.settings_fields import config_key, number_fields, numbers_of, required


def checked_config(cfg: DictConfig) -> CheckedConfig:
    """Refuses a config that does not resolve or lacks a part a run reads; returns it with its numbers checked, each
    value checked once here and handed on as checked."""
    _check_whole(cfg)
    numbers = checked_numbers(cfg)
    return CheckedConfig(with_checked_values(cfg, numbers), numbers)


# Every number of a run's config, checked once (`checked_numbers`) before any part of the settings is built: key ->
# what it allows (`settings_fields.Number`), read from the settings' fields, the one home of each setting's kind,
# range and default. A key the config does not hold keeps its field's default; one whose field has none is refused.
# How values go together is their part's to check (`OptimConfig`: one decay schedule).
PARTS = ((RunSettings, ""), (TrainerSettings, "trainer"), (TaskSettings, "task"), (OptimConfig, "optim"))
NUMBERS = {key: number for cls, part in PARTS for key, number in numbers_of(cls, part).items()}
REQUIRED_NUMBERS = tuple(config_key(part, f) for cls, part in PARTS for f, _ in number_fields(cls) if required(f))
ABSENT = object()


def checked_numbers(cfg: DictConfig) -> dict[str, Any]:
    """Each value of NUMBERS the config holds, as its kind, or one message naming its key; and the values each of
    `task.phases` sets (`checked_phases`)."""
    checked = {}
    for key, allowed in NUMBERS.items():
        value = OmegaConf.select(cfg, key, default=ABSENT)
        if value is ABSENT and key in REQUIRED_NUMBERS:
            raise ConfigError(f"{key} is not set (an override ~{key}?); every run needs it: set {key}=...")
        if value is not ABSENT:
            checked[key] = allowed.check(key, value)
    checked |= checked_phases(cfg)
    return checked


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
                checked[key] = rule.check(key, changes[name])
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
        same_list = isinstance(value, tuple) and OmegaConf.is_list(given) and list(given) == list(value)
        if not whole and not same_list and (type(given) is not type(value) or given != value):
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
