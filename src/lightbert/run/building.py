"""A run's objects, built from its settings' config nodes (`hydra.utils.instantiate`, with errors that name the
config keys to change): the DataModule, the LightningModule holding init_from's weights (the model `run.model_choice`
decided, with the tokenizer's vocabulary) with the speed switches applied, the callbacks, the loggers and the Trainer.
`run.train` and `run.evaluate` call them in the order a run needs them."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from lightbert.checkpoints.reading import Pretrained
from lightbert.errors import ConfigError, ParameterError, UserError, message_of
from lightbert.model_config import BertConfig
from lightbert.plugins.agreement import SameResumeOnEveryNode
from lightbert.plugins.callbacks import CompileTime, FineTuningResume, RunProgressBar
from lightbert.plugins.checkpointing import (
    AtomicCheckpointIO,
    CheckpointsWhereTheRunIs,
    EpochsFromPhaseStart,
    LatestCheckpoint,
    ResumableRNG,
)
from lightbert.plugins.launcher import use_run_launcher
from lightbert.plugins.loggers import RunCSVLogger
from lightbert.run.model_choice import RunModel
from lightbert.run.run_dir import Start
from lightbert.run.settings import RunSettings
from lightbert.run.speed import apply_speed_switches
from lightbert.tasks.pretraining.continued import load_pretrained_weights

log = logging.getLogger(__name__)


def config_keys(node: DictConfig) -> dict[str, str]:
    """Each parameter of a node that builds an object (e.g. `task.datamodule`) -> the key a user sets for it: the
    key it interpolates (`max_seq_length: ${task.max_seq_length}` -> task.max_seq_length), else its own."""
    path = node._get_full_key(None)
    keys = {}
    for name, value in OmegaConf.to_container(node, resolve=False).items():
        match = re.fullmatch(r"\$\{([\w.]+)\}", value) if isinstance(value, str) else None
        keys[str(name)] = match.group(1) if match else f"{path}.{name}"
    return keys


def named(error: ParameterError, keys: dict[str, str]) -> ConfigError:
    """`error` with each parameter named by its config key (`keys`: parameter -> key)."""
    return ConfigError(error.template.format(*(keys.get(p, p) for p in error.parameters)))


@contextmanager
def parameters_named_by(node: DictConfig) -> Iterator[None]:
    """A `ParameterError` raised while building (or first using) the object of `node` names config keys."""
    try:
        yield
    except ParameterError as error:
        keys = config_keys(node)
        raise named(error, keys) from None


def instantiate_config(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, letting a `UserError` raised by the target through unwrapped, with the config
    keys of the parameters a `ParameterError` names."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, ParameterError) and isinstance(node, DictConfig):
            keys = config_keys(node)
            raise named(cause, keys) from None
        if isinstance(cause, UserError):
            raise cause from None
        raise
    except MissingMandatoryValue as error:
        raise UserError(
            f"{error.full_key} is required: set it on the command line, e.g. {error.full_key}=..."
        ) from None


def step_compiles(settings: RunSettings, training: bool) -> bool:
    """Whether the run compiles its step, decided once for its batches' shapes and its module: a training run as
    `RunSettings.compiles`; an evaluation as speed.compile says (null: it stays eager)."""
    return settings.compiles if training else bool(settings.speed.compile)


def datamodule(settings: RunSettings, kwargs: dict, changes: dict | None = None):
    """The task's DataModule (a phase's `changes` to task.datamodule applied); its batches' shapes are the speed
    switches' (`run.speed.apply_speed_switches`). Partial, then called: objects passed through instantiate() would
    be turned into configs."""
    with parameters_named_by(settings.task.datamodule):
        built = instantiate_config(settings.task.datamodule, **(changes or {}), _partial_=True)(**kwargs)
        built.tokenizer  # noqa: B018  (its first use: a bad tokenizer_path is named as the key here)
    if changes is None and getattr(built, "capped_slots", None):
        log.info(built.capped_slots)
    return built


def phase_datamodules(settings: RunSettings, first: L.LightningDataModule) -> dict[int, Any]:
    """Each of `task.phases`' DataModules (by its number from 1), with the run's tokenizer (`first`'s: the words it
    began with), built before the first phase trains: a value a phase's DataModule refuses is refused at the start,
    naming the phase, not after the phases before it trained (90% of the paper's recipe). None without phases."""
    phases = settings.phases
    if len(phases) < 2:
        return {}
    built, said = {}, {getattr(first, "capped_slots", None)}
    for number, phase in enumerate(phases, start=1):
        kwargs = {"tokenizer": first.tokenizer, "first_step": phase.first_step, "add_words": None}
        try:
            built[number] = datamodule(settings, kwargs, phase.datamodule)
        except UserError as error:
            raise UserError(f"task.phases[{number - 1}] {phase.datamodule}: {message_of(error)}") from None
        capped = getattr(built[number], "capped_slots", None)
        if capped not in said:
            log.info(f"phase {number}: {capped}")
            said.add(capped)
    return built


def data_and_module(settings: RunSettings, model: RunModel, kwargs: dict, training: bool = True):
    """A run's data and its LightningModule. The data: the task's DataModule, and for training each phase's
    (`phase_datamodules`; none without phases). The module: the model `run.model_choice` decided, with the tokenizer's
    vocabulary, holding init_from's weights (and its head where `RunModel.carry` says so). Then the speed switches, on
    the data's batches and the module. Returns the DataModule, the phases' DataModules by number, the module and the
    weights that start fresh."""
    compiles = step_compiles(settings, training)  # decided once, for the batches' shapes and the module
    data = datamodule(settings, kwargs)
    phases = phase_datamodules(settings, data) if training else {}
    pretrained = model.pretrained
    module = instantiate_config(
        settings.task.module,
        model=with_vocabulary(model.config, data.tokenizer, pretrained),
        optim=settings.optim.hyperparameters(),
        **model.chosen,
        _convert_="all",
    )
    fresh = load_pretrained_weights(module.model, pretrained, data.tokenizer, model.carry) if pretrained else []
    speed, trainer, task = settings.speed, settings.trainer, settings.task
    datamodules = (data, *phases.values())
    apply_speed_switches(module, speed, trainer, task.packing, compiles, training, task.cache_dir, datamodules)
    return data, phases, module, fresh


def with_vocabulary(config: BertConfig, tokenizer, pretrained: Pretrained | None) -> dict:
    """The architecture as the LightningModule takes it, with its vocabulary: the size files leave it to the
    tokenizer; a checkpoint brings its own embedding rows, which its tokenizer fits (`run.model_choice.vocabulary`),
    or as many as the run's tokenizer has tokens where it has more (the words `task.datamodule.add_words` added:
    `continued.load_pretrained_weights` grows init_from's rows for them)."""
    if pretrained is None:
        return replace(config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id).to_dict()
    return replace(config, vocab_size=max(pretrained.config["vocab_size"], tokenizer.vocab_size)).to_dict()


# What evaluation runs without: it saves no checkpoint and trains no step.
TRAINING_ONLY_CALLBACKS = (ModelCheckpoint, LatestCheckpoint, ResumableRNG, LearningRateMonitor)


def callbacks(settings: RunSettings, start: Start | None = None, first_step: int = 0) -> list:
    """The run's callbacks: the config's, and the job's one resume decision (`start`); without `start`, an
    evaluation's, which saves no checkpoint and trains no step. `first_step`: where the phase of the recipe that they
    train starts (`EpochsFromPhaseStart`, for a later phase)."""
    built = [instantiate_config(c) for c in settings.callbacks]
    if start is None:
        return [c for c in built if not isinstance(c, TRAINING_ONLY_CALLBACKS)]
    return [
        *built,
        SameResumeOnEveryNode(settings.output_dir, start.step if start.resuming else None),
        *([FineTuningResume()] if start.resuming and settings.task.fine_tuning else []),
        *([CheckpointsWhereTheRunIs()] if start.resuming else []),  # a run directory moved since it was saved
        *([CompileTime()] if settings.compiles else []),
        *([EpochsFromPhaseStart(first_step)] if first_step else []),
    ]


def loggers(config: DictConfig, resumed_step: float | None = None) -> list:
    """The loggers of the config as recorded (`record.recorded_config`), each given it whole as hyperparameters."""
    built = [instantiate_config(c) for c in (config.get("logger") or {}).values()]
    for logger in built:  # the resolved config, and the command line that made it
        if isinstance(logger, RunCSVLogger) and resumed_step is not None:
            logger.resumed_step = resumed_step  # metrics.csv continues from the checkpoint's step
        logger.log_hyperparams(OmegaConf.to_container(config, resolve=True))
    return built


def trainer(settings: RunSettings, callbacks: list, loggers: list, **overrides: Any) -> L.Trainer:
    if settings.trainer.progress_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks = [*callbacks, RunProgressBar()]  # lightbert's bar, not Lightning's default (Rich where installed)
    overrides.setdefault("accumulate_grad_batches", settings.batches.accumulate)
    plugins = [instantiate_config(p) for p in settings.trainer.config.get("plugins") or []]
    built = instantiate_config(
        settings.trainer.config,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO(), *plugins],
        **overrides,
    )
    use_run_launcher(built)  # a DDP process that dies is named, not a SIGKILL of the whole job
    return built
