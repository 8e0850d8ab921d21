"""The checks that refuse a command on this machine, before anything is written: the devices the trainer asks for, the
cache every run writes, fp8's tensor cores, a resume on a job of another shape than the checkpoint's, and the data the
run reads here (its sources, each with its identity, for the record: `data_sources`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from lightbert.data.local_files import file_identity
from lightbert.errors import ConfigError, UserError
from lightbert.files import cannot_be_made
from lightbert.model.fp8 import MIN_CAPABILITY, import_torchao
from lightbert.plugins.checkpointing import saved_job_shape
from lightbert.run.building import instantiate_config
from lightbert.run.phases import Phase
from lightbert.run.run_dir import Start
from lightbert.run.settings import RunSettings
from lightbert.tasks.pretraining.corpus import TextCorpus

log = logging.getLogger(__name__)


def check_devices(settings: RunSettings) -> None:
    """Refuses a trainer that cannot run on this machine's devices, and a global batch they cannot make."""
    trainer = settings.trainer
    if trainer.wants_cuda and not torch.cuda.is_available():
        raise UserError(
            f"trainer={trainer.option or trainer.accelerator} needs a CUDA GPU and none is visible here; use "
            "trainer=cpu, or check the command on CPU first with trainer.accelerator=cpu trainer.devices=2 "
            "trainer.max_steps=3"
        )
    settings.batches  # noqa: B018  (the devices resolved: a global batch they cannot make is refused here)


def check_cache_dir(settings: RunSettings) -> None:
    """Refuses a cache every run writes (tokenizers, encoded examples, datasets' own files) that cannot be written: a
    read-only mount, a file in its place, a directory of another user's. Found later, it was a traceback from
    `datasets` after the run's record was written."""
    given = settings.task.cache_dir
    if not given:
        return
    path = Path(given).expanduser()
    problem = cannot_be_made(path)
    if problem is not None:
        raise UserError(
            f"the cache paths.cache_dir={path} cannot be written: {problem}; every run writes its tokenizer and "
            "encoded data there. Point it at a writable directory with paths.cache_dir=... (or the LIGHTBERT_CACHE "
            "environment variable)"
        )


def check_fp8_device(settings: RunSettings) -> None:
    """Refuses speed.fp8=true without torchao, or on a CUDA GPU without float8 tensor cores (on a CPU torchao
    emulates the kernels: the tests' path)."""
    import_torchao()
    if settings.trainer.on_cuda:
        capability = torch.cuda.get_device_capability()
        if capability < MIN_CAPABILITY:
            raise ConfigError(
                f"speed.fp8=true needs a GPU with float8 tensor cores (H100, Ada: compute capability 8.9 or later); "
                f"{torch.cuda.get_device_name()} is {capability[0]}.{capability[1]}. Leave speed.fp8=false here"
            )


def check_job_shape(settings: RunSettings, start: Start) -> bool:
    """Whether a resume runs on another number of devices with the checkpoint's global batch: the data continues
    exactly (its position is the step, each step the same examples), said once; the record then lets the devices,
    nodes and accumulation differ. Another global batch would re-train or skip examples: refused with the key that
    keeps it. A checkpoint from before lightbert recorded its job's shape resumes only as it was recorded.

    A recipe's phase may train its own batch (`task.phases[i].datamodule.batch_size`: the modern recipe's 8,192-token
    phase takes 1 row for 8 of 1,024): a checkpoint is compared with the batch of the phase its step falls in."""
    if not start.resuming:
        return False
    resume_from = start.resume_from
    shape = saved_job_shape(resume_from)
    if not shape or shape.get("global_batch") is None:
        return False
    batches = settings.batches
    world = batches.devices * batches.nodes
    # The batch per device of the phase that trained the checkpoint's step; at a boundary, of either phase (the
    # earlier one's last checkpoint, or the later one's stopped before its first step). The devices and the
    # accumulation are the run's in every phase.
    sizes = [phase.datamodule.get("batch_size", batches.per_device) for phase in phases_at(settings.phases, start.step)]
    per_device = next((size for size in sizes if size * world * batches.accumulate == shape["global_batch"]), sizes[0])
    global_batch = per_device * world * batches.accumulate
    then = f"{shape['batch_size']} per device x {shape['world_size']} device(s) x {shape['accumulate']} accumulated"
    now = f"{per_device} per device x {world} device(s) x {batches.accumulate} accumulated"
    if global_batch != shape["global_batch"]:
        # task.global_batch_size is the first phase's global batch (task.batch_size's); a phase's scales with it.
        keeps, left = divmod(shape["global_batch"] * batches.per_device, per_device)
        keep = (
            f"Keep the global batch with task.global_batch_size={keeps} (the accumulation adapts), or start"
            if not left
            else "Start"
        )
        raise ConfigError(
            f"{resume_from} was trained with {shape['global_batch']} sequences per step ({then}), and this job makes "
            f"{global_batch} ({now}): resumed so, it would train some examples twice or skip some. {keep} a new run "
            "from its weights with init_from=..."
        )
    if world != shape["world_size"]:
        log.info(
            f"resuming on {world} device(s), the checkpoint's job had {shape['world_size']}: the global batch stays "
            f"{global_batch} ({now}), and the data continues at step {start.step}"
        )
    return world != shape["world_size"] or batches.accumulate != shape["accumulate"]


def phases_at(phases: tuple[Phase, ...], step: int) -> list[Phase]:
    """The phases whose job may have saved a checkpoint of `step`: the one that trained that step (the first at step
    0), and at a boundary the next one too, stopped before its first step."""
    return [phase for phase in phases if phase.first_step <= step <= phase.end_step] or [phases[-1]]


def data_sources(settings: RunSettings) -> dict[str, Any]:
    """What the run's data is read from on this machine, each with its identity (`data.local_files.file_identity`:
    size, time, inode), which the record keeps and a resume is checked against (`record.record_run`): the fine-tuning
    files, or the pre-training corpus's files (its fingerprint for the hub's or the demo). The corpus is built from
    its node here, so a corpus file that is missing, empty or not UTF-8 is refused before init_from is read."""
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
