"""What every run does before it trains: the checks that refuse a command on this machine (devices, init_from and
the architecture, a resume on another job shape), then the run's record (`.hydra/`, `.hydra/data.json`, train.log)
and the run line. A command refused here leaves its run directory as it found it."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from datasets.utils import logging as datasets_logging
from omegaconf import DictConfig

from lightbert.checkpoints.reading import Pretrained, load_pretrained
from lightbert.data.local_files import file_identity
from lightbert.errors import ConfigError, UserError
from lightbert.model.fp8 import MIN_CAPABILITY, import_torchao
from lightbert.model_config import BertConfig
from lightbert.plugins.checkpointing import saved_job_shape
from lightbert.run.building import instantiate_config
from lightbert.run.console import RunLogFile, tidy_lightning_console
from lightbert.run.record import record_run
from lightbert.run.run_line import describe_run
from lightbert.run.settings import MATMUL_PRECISIONS, RunSettings, Start
from lightbert.run.weights import run_model
from lightbert.tasks.pretraining.corpus import TextCorpus

log = logging.getLogger(__name__)


def prepare(
    settings: RunSettings, start: Start, check: Callable[[Pretrained], None] | None = None, evaluation: bool = False
) -> tuple[Pretrained | None, BertConfig, DictConfig]:
    """The checks, then the record. `check` refuses an init_from the command cannot use (evaluation: one without
    the task's head). Returns init_from's checkpoint, the architecture, and the config as recorded (naming the
    model that runs)."""
    _quiet_known_warnings()
    check_devices(settings)
    check_cache_dir(settings)
    settings.batches  # noqa: B018  (a global batch these devices cannot make is refused here)
    matmuls = set_fp32_matmuls(settings)
    # A resume that changes a setting is refused by the record (the devices and nodes may change where the global
    # batch stays), or its data.
    resized = _resized(settings, start) if start.resuming else False
    if settings.speed.fp8 and not evaluation:  # evaluation runs no fp8: it trains nothing
        check_fp8_device(settings)
    sources = data_sources(settings)
    tidy_lightning_console()
    datasets_logging.disable_progress_bar()  # on only around maps worth watching (data.local_files.progress_bars_for)
    # Set before any DataLoader or datasets.map worker forks, so the Rust tokenizer never deadlocks in one.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    L.seed_everything(settings.seed, workers=True)
    pretrained = load_pretrained(settings.init_from) if settings.init_from else None
    if pretrained is not None and pretrained.tokenizer is None and not settings.task.tokenizer_path:
        raise UserError(
            f"init_from={settings.init_from} comes without its tokenizer (tokenizer.json or vocab.txt beside the "
            "weights); copy the tokenizer it was trained with there, or give it with task.datamodule.tokenizer_path=..."
        )
    if check is not None and pretrained is not None:
        check(pretrained)
    model = run_model(settings, start, pretrained)
    record_run(model.recorded, settings.overrides, settings.output_dir, start.resuming, resized, sources)
    RunLogFile.start()  # train.log from here on, with what was logged while the checks ran
    log.info(describe_run(settings, model.config, evaluation, matmuls, model.left_to_right, start))
    return model.pretrained, model.config, model.recorded


def _quiet_known_warnings() -> None:
    # The run directory holds .hydra/ when the CSV logger starts writing there: not a problem.
    warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
    warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*")  # Lightning internals vs newer torch
    # DDP's gradient hooks run on the default stream and torch notes at the first backward that AccumulateGrad's
    # stream differs (seen on an H100): nothing a user can change, and no synchronisation DDP does not do anyway.
    warnings.filterwarnings("ignore", message=".*AccumulateGrad node's stream.*")
    # Loader workers are lightbert's choice, said on the console (task.datamodule.num_workers=auto): Lightning's
    # advice to raise them, on every run of a many-core machine, is not the user's to act on.
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    # A short epoch logs once per epoch instead (callbacks.ShortEpochLogging): nothing left for the user to do.
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
    # A fine-tuning run resumed within an epoch: run.callbacks.FineTuningResume says what that epoch trains instead
    # (pre-training's loaders resume by step and never raise it).
    warnings.filterwarnings("ignore", message=".*dataloader is not resumable.*")
    # The feature-based tasks keep their frozen encoder in eval mode on purpose (no dropout in the features).
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode at the start of training.*")


def check_devices(settings: RunSettings) -> None:
    """Refuses, before anything is written, a trainer that cannot run on this machine's devices."""
    trainer = settings.trainer
    if trainer.wants_cuda and not torch.cuda.is_available():
        raise UserError(
            f"trainer={trainer.option or trainer.accelerator} needs a CUDA GPU and none is visible here; use "
            "trainer=cpu, or check the command on CPU first with trainer.accelerator=cpu trainer.devices=2 "
            "trainer.max_steps=3"
        )


def check_fp8_device(settings: RunSettings) -> None:
    """Refuses speed.fp8=true without torchao, or on a CUDA GPU without float8 tensor cores, before anything is
    written (on a CPU torchao emulates the kernels: the tests' path)."""
    import_torchao()
    if settings.trainer.on_cuda:
        capability = torch.cuda.get_device_capability()
        if capability < MIN_CAPABILITY:
            raise ConfigError(
                f"speed.fp8=true needs a GPU with float8 tensor cores (H100, Ada: compute capability 8.9 or later); "
                f"{torch.cuda.get_device_name()} is {capability[0]}.{capability[1]}. Leave speed.fp8=false here"
            )


def check_cache_dir(settings: RunSettings) -> None:
    """Refuses, before anything is written, a cache every run writes (tokenizers, encoded examples, datasets' own
    files) that cannot be written: a read-only mount, a file in its place, a directory of another user's. Found
    later, it was a traceback from `datasets` after the run's record was written. (`os.access` asks the system:
    it says a read-only file system is not writable even to root, for whom permissions are no obstacle.)"""
    given = settings.task.cache_dir
    if not given:
        return
    path = Path(given).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the cache is made when first used: where it would be made
    if not existing.is_dir():
        problem = f"{existing} is a file, not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        problem = f"{existing} is on a read-only file system" if read_only else f"{existing} is not writable"
    else:
        return
    raise UserError(
        f"the cache paths.cache_dir={path} cannot be written: {problem}; every run writes its tokenizer and encoded "
        "data there. Point it at a writable directory with paths.cache_dir=... (or the LIGHTBERT_CACHE environment "
        "variable)"
    )


def set_fp32_matmuls(settings: RunSettings) -> str | None:
    """On CUDA, fp32 matrix multiplications on TF32 tensor cores by default (`speed.matmul_precision: high`, the
    advice torch and Lightning give for Ampere and later GPUs; bf16-mixed runs most matmuls in bf16 anyway, TF32
    covers what stays fp32). Returns what the run line says, or None where no CUDA device runs the job."""
    if not settings.trainer.on_cuda:
        return None
    torch.set_float32_matmul_precision(settings.speed.matmul_precision)
    return MATMUL_PRECISIONS[settings.speed.matmul_precision]


def _resized(settings: RunSettings, start: Start) -> bool:
    """Whether a resume runs on another number of devices with the checkpoint's global batch: the data continues
    exactly (its position is the step, each step the same examples), said once. Another global batch would re-train
    or skip examples: refused with the key that keeps it. A checkpoint from before lightbert recorded its job's
    shape resumes only as it was recorded."""
    resume_from = start.resume_from
    shape = saved_job_shape(resume_from)
    if not shape or shape.get("global_batch") is None:
        return False
    batches = settings.batches
    world = batches.devices * batches.nodes
    then = f"{shape['batch_size']} per device x {shape['world_size']} device(s) x {shape['accumulate']} accumulated"
    now = f"{batches.per_device} per device x {world} device(s) x {batches.accumulate} accumulated"
    if batches.global_batch != shape["global_batch"]:
        raise ConfigError(
            f"{resume_from} was trained with {shape['global_batch']} sequences per step ({then}), and this job makes "
            f"{batches.global_batch} ({now}): resumed so, it would train some examples twice or skip some. Keep the "
            f"global batch with task.global_batch_size={shape['global_batch']} (the accumulation adapts), or start a "
            "new run from its weights with init_from=..."
        )
    if world != shape["world_size"]:
        log.info(
            f"resuming on {world} device(s), the checkpoint's job had {shape['world_size']}: the global batch stays "
            f"{batches.global_batch} ({now}), and the data continues at step {start.step}"
        )
    return world != shape["world_size"] or batches.accumulate != shape["accumulate"]


def data_sources(settings: RunSettings) -> dict[str, Any]:
    """What the run's data is read from, each with its identity (lightbert.data.local_files.file_identity): the
    fine-tuning files, or the pre-training corpus's files (its fingerprint for the hub's or the demo)."""
    task = settings.task
    if task.fine_tuning:
        given = {split: Path(path).expanduser() for split, path in task.data_files.items()}
        if not given:
            return {"task.datamodule.hub_dataset": task.hub_dataset}
        return {f"task.data_files.{s}": file_identity(p) if p.is_file() else str(p) for s, p in given.items()}
    if settings.corpus is None:
        return {}
    corpus = instantiate_config(settings.corpus)
    if isinstance(corpus, TextCorpus):
        return {str(path): file_identity(path) for path in corpus.paths}
    return {"corpus": corpus.fingerprint}
