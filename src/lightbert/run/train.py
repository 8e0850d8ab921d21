"""`train(cfg)`: one training run from a composed Hydra config, read top to bottom in one function. `python
src/train.py` (and `lightbert-train`) calls it; so do notebooks and tests (`lightbert.train`).

A run, in order: its settings built once and checked, before torch and Lightning load, so that a bad value is refused
in a second (`run.settings`); the run directory held and how the run starts decided (`run.run_dir`); the checks on
this machine (`run.machine_checks`); the seed; init_from and the model (`run.model_choice`); the record and the run line
(`run.record`, `run.run_line`); the DataModule, the LightningModule, the loggers and the Trainer (`run.building`);
fit, phase by phase; the test predictions and the results (`run.outputs`). A command refused before the record is
written leaves its run directory as it found it.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig

from lightbert.cluster import processes
from lightbert.cluster.environment import adopt_submitit_local_ranks, is_global_zero
from lightbert.run.config_checks import checked_config
from lightbert.run.console import RunLogFile, logging_like_the_command, quiet_console
from lightbert.run.run_dir import LAST_CHECKPOINT, held
from lightbert.run.settings import RunSettings

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and validate as `cfg` says; write `results.json` in the run directory and return its content.

    The run directory is the user's record: it is held for this run alone, and a command refused by the checks
    before training writes nothing into it. SIGTERM or Ctrl-C ends the process as they end the command: during
    training after the current batch, with `last.ckpt` saved and one line that says how to continue, then exit
    128 + the signal's number; before or after training at once, with one line. A training loss that becomes NaN or
    infinite stops the run at that step with `plugins.checkpointing.NotFiniteError` (a `UserError`: the command
    prints its one line and exits 2), no checkpoint of that state and no results.json; the newest checkpoint, saved
    before, is the last finite state."""
    with environment_restored():
        return train_in(cfg)


@contextmanager
def environment_restored() -> Iterator[None]:
    """The process's environment as it was before the run: Lightning's DDP sets `LOCAL_RANK`, `NODE_RANK`,
    `MASTER_ADDR`, `MASTER_PORT` (and the seed's `PL_GLOBAL_SEED`) in the process that calls `train`; left behind, a
    second `lightbert.train` in the same notebook or Python process would take itself for a launched rank and wait for
    a job that is not there."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)


def train_in(cfg: DictConfig) -> dict[str, Any]:
    """`train`'s run, in the environment `train` restores afterwards."""
    adopt_submitit_local_ranks()  # before anything asks which process this is
    # A bad value is refused here, before anything is read or written: the config as a whole, then its parts.
    checked = checked_config(cfg)
    settings = RunSettings.from_config(checked)
    output_dir = settings.output_dir
    processes.install()  # its DataLoader workers and data-preparation pool die with it, and hold no lock
    with logging_like_the_command(output_dir), held(settings) as start, processes.stops_cleanly(output_dir):
        # torch and Lightning load from here on: the command was judged without them.
        import lightning as L
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from lightbert.checkpoints.reading import load_pretrained
        from lightbert.plugins import checkpointing
        from lightbert.plugins.loggers import finish_wandb, summarise_in_wandb
        from lightbert.run import building, machine_checks
        from lightbert.run.model_choice import run_model
        from lightbert.run.outputs import results, write_results, write_test_predictions
        from lightbert.run.record import record_run, recorded_config
        from lightbert.run.run_line import describe_phases, describe_run

        started = time.time()
        quiet_console()
        try:
            # The checks on this machine: a command refused here leaves its run directory as it found it.
            machine_checks.check_devices(settings)
            machine_checks.check_cache_dir(settings)
            # A resume that changes a setting is refused by the record (the devices and nodes may change where the
            # global batch stays), or its data.
            resized = machine_checks.check_job_shape(settings, start)
            if settings.speed.fp8:
                machine_checks.check_fp8_device(settings)
            sources = machine_checks.data_sources(settings)  # the data read here, each source with its identity
            # Set before any DataLoader or datasets.map worker forks, so the Rust tokenizer never deadlocks in one.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            L.seed_everything(settings.seed, workers=True)

            # init_from and the model: its sizes, name and vocabulary checked before anything is written.
            pretrained = load_pretrained(settings.init_from) if settings.init_from else None
            model = run_model(settings, start, pretrained)

            # The record (.hydra/, checked against a resume), then train.log and the run line.
            config = recorded_config(settings, model.config, model.name)
            record_run(config, settings.overrides, output_dir, start.resuming, resized, sources)
            RunLogFile.start()  # train.log from here on, with what was logged while the checks ran
            log.info(describe_run(settings, model.config, False, model.left_to_right, start))
            phase_lines = describe_phases(settings)

            try:
                # The DataModule (each phase's too, with the tokenizer the run began with: a phase's data is refused
                # now, not after a phase trained) and the LightningModule, with init_from's weights.
                datamodule, phase_data, module, _ = building.data_and_module(settings, model, model.tokenizer)
                if not start.resuming and is_global_zero():
                    # Next to the checkpoints, so a run directory is enough to load the model again.
                    datamodule.tokenizer.save(output_dir / "tokenizer.json")

                # From the first collective to the last (the end's barrier): a process of the job that dies is
                # named here.
                with processes.naming_lost_processes(output_dir):
                    # The loggers: metrics.csv continues from the checkpoint's step, or after every row of an attempt
                    # that left no checkpoint.
                    again = settings.resume or start.requeued
                    loggers = building.loggers(config, start.step if start.resuming else math.inf if again else None)

                    # Fit, phase by phase.
                    resume_from, phases = start.resume_from, settings.phases
                    for number, phase in enumerate(phases, start=1):
                        if len(phases) > 1:
                            if phase.end_step <= start.step and number < len(phases):
                                continue  # finished before the checkpoint this run resumes from
                            log.info(phase_lines[number - 1])
                            datamodule = phase_data[number]
                        # Fresh callbacks for each phase: their state comes back from the checkpoint it starts from.
                        trainer = building.trainer(
                            settings,
                            building.callbacks(settings, start, phase.first_step),
                            loggers,
                            **({"max_steps": phase.end_step} if len(phases) > 1 else {}),
                        )
                        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
                        resume_from = output_dir / LAST_CHECKPOINT  # the next phase starts from this one's state

                    # The outputs: the test predictions and results.json.
                    outcome = results(trainer, output_dir, time.time() - started)
                    outcome["predictions"] = write_test_predictions(trainer, module, datamodule, output_dir)
                    write_results(outcome, output_dir)
                    summarise_in_wandb(trainer, outcome)
                    processes.end_process_group()
                    return outcome
            finally:
                finish_wandb()
        except checkpointing.NotFiniteError:
            # A NaN loss stops every process at the same step, each with the same line: the first says it.
            if not is_global_zero():
                sys.exit(2)
            raise
        except SIGTERMException:
            # Lightning stopped after the current batch and LatestCheckpoint saved it; exit as a process killed by
            # the signal does (SIGTERM, or SIGINT for Ctrl-C).
            stopped_by = checkpointing.stopped_by
            print(
                f"lightbert: stopped by {stopped_by.name}; the latest state is in {output_dir}/{LAST_CHECKPOINT}. "
                f"To continue, rerun the same command with hydra.run.dir={output_dir} resume=true",
                file=sys.stderr,
            )
            sys.exit(128 + stopped_by)
