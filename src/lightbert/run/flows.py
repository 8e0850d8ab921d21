"""The flows of a held run (`run.jobs` holds it): training (`fit`) and evaluation (`validate`). Each, in order: the
checks on this machine, then the run's record and its line (`run.preflight`); the DataModule, the LightningModule
with init_from's weights, the callbacks, the loggers and the Trainer (`run.building`); fit or validate; the test
predictions and the results (`run.outputs`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from lightbert.cluster import processes
from lightbert.cluster.environment import is_global_zero
from lightbert.data.tokenizer import load_tokenizer
from lightbert.errors import UserError
from lightbert.plugins.loggers import finish_wandb, summarise_in_wandb
from lightbert.run import building
from lightbert.run.outputs import results as run_results
from lightbert.run.outputs import write_results, write_test_predictions
from lightbert.run.preflight import prepare
from lightbert.run.run_dir import LAST_CHECKPOINT
from lightbert.run.settings import RunSettings, Start
from lightbert.run.weights import check_head

log = logging.getLogger(__name__)


def fit(settings: RunSettings, start: Start) -> dict[str, Any]:
    """The training run of held settings (`run_dir.held` decided how it starts)."""
    started, output_dir = time.time(), settings.output_dir
    log.info(f"run directory: {output_dir}")  # first on the console (train.log holds it until the checks pass)
    _say_how_it_starts(settings, start)
    pretrained, model_config, config = prepare(settings, start)
    try:
        tokenizer = {"tokenizer": pretrained.tokenizer} if pretrained and pretrained.tokenizer else {}
        if start.resuming and (output_dir / "tokenizer.json").is_file():
            # The run's own tokenizer: the ids its checkpoint was trained on, whatever the corpus now holds.
            tokenizer = {"tokenizer": load_tokenizer(output_dir / "tokenizer.json")}
            if settings.task.add_words is not None:
                tokenizer["add_words"] = None  # the words added when the run began are in it: none are added again
        datamodule, module, _ = building.data_and_module(settings, pretrained, model_config, tokenizer)
        if not start.resuming and is_global_zero():
            # Next to the checkpoints, so a run directory is enough to load the model again.
            datamodule.tokenizer.save(output_dir / "tokenizer.json")
        # metrics.csv continues from the checkpoint's step, or after every row of an attempt that left no checkpoint
        keep_rows_before = start.step if start.resuming else (math.inf if settings.resume or start.requeued else None)
        loggers = building.loggers(config, keep_rows_before)
        resume_from, phases = start.resume_from, settings.phases
        # From the first collective to the last (the end's barrier): a process of the job that dies is named here.
        with processes.naming_lost_processes(output_dir):
            for number, phase in enumerate(phases, start=1):
                if len(phases) > 1:
                    if phase.end_step <= start.step and number < len(phases):
                        continue  # finished before the checkpoint this run resumes from
                    log.info(
                        f"phase {number}/{len(phases)}: steps {phase.first_step}-{phase.end_step}, {phase.datamodule}"
                    )
                    phase_kwargs = {"tokenizer": datamodule.tokenizer, "first_step": phase.first_step}
                    phase_kwargs["add_words"] = None  # the tokenizer has the words the run began with
                    datamodule = building.datamodule(settings, phase_kwargs, phase.datamodule)
                # Fresh callbacks for each phase: their state comes back from the checkpoint the phase starts from.
                trainer = building.trainer(
                    settings,
                    building.callbacks(settings, start),
                    loggers,
                    **({"max_steps": phase.end_step} if len(phases) > 1 else {}),
                )
                trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
                resume_from = output_dir / LAST_CHECKPOINT  # the next phase starts from this one's weights, optimizer
            results = run_results(trainer, output_dir, time.time() - started)
            results["predictions"] = write_test_predictions(trainer, module, datamodule, output_dir)
            write_results(results, output_dir)
            summarise_in_wandb(trainer, results)
            processes.end_process_group()
            return results
    finally:
        finish_wandb()


def validate(settings: RunSettings, start: Start) -> dict[str, Any]:
    """The evaluation run of held settings: init_from's fine-tuned model on the task's validation splits."""
    started = time.time()
    log.info(f"run directory: {settings.output_dir}")
    pretrained, model_config, config = prepare(settings, start, lambda p: check_head(settings, p), evaluation=True)
    try:
        kwargs = {"tokenizer": pretrained.tokenizer} if pretrained.tokenizer else {}
        if settings.task.fine_tuning:  # fine-tuning data: no training split needed
            kwargs["fit"] = False
        datamodule, module, fresh = building.data_and_module(settings, pretrained, model_config, kwargs, training=False)
        task = settings.task
        if fresh:
            raise UserError(
                f"init_from={settings.init_from} has no fine-tuned {task.name} head: {', '.join(fresh[:3])} would be "
                f"untrained. Evaluate a model fine-tuned for task={task.option or '...'} (its run directory or .ckpt)"
            )
        trained_for = pretrained.hyper_parameters.get("task")
        if trained_for and trained_for != task.name:
            log.warning(
                f"init_from={settings.init_from} was fine-tuned on {trained_for}, and is evaluated on {task.name}"
            )
        trainer = building.trainer(settings, building.callbacks(settings), building.loggers(config))
        with processes.naming_lost_processes(settings.output_dir, training=False):
            trainer.validate(module, datamodule=datamodule)
            results = {
                "evaluated": pretrained.source,
                "metrics": {name: float(value) for name, value in sorted(trainer.callback_metrics.items())},
                "predictions": write_test_predictions(trainer, module, datamodule, settings.output_dir),
                "output_dir": str(settings.output_dir),
                "seconds": round(time.time() - started, 1),
            }
            write_results(results, settings.output_dir)
            summarise_in_wandb(trainer, results)
            processes.end_process_group()
            return results
    finally:
        finish_wandb()


def _say_how_it_starts(settings: RunSettings, start: Start) -> None:
    output_dir = settings.output_dir
    if start.requeued:
        job, restarts = os.environ["SLURM_JOB_ID"], os.environ["SLURM_RESTART_COUNT"]
        log.info(f"SLURM job {job} was requeued ({restarts} restart(s)): continuing its run")
    if (settings.resume or start.requeued) and not start.resuming:
        kept = _metric_rows(output_dir / "metrics.csv")
        also = f"; metrics.csv keeps the {kept} row(s) of the earlier attempt and continues after them" if kept else ""
        log.info(f"resume=true and no {output_dir / LAST_CHECKPOINT} yet: starting from the beginning{also}")


def _metric_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(newline="") as file:
        return max(0, sum(1 for _ in file) - 1)
