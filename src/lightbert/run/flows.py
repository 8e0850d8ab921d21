"""The flows of a held run (`run.jobs` holds it): training (`fit`) and evaluation (`validate`). Each: the checks on
this machine, then the run's record (`run.preflight`); the DataModule and the LightningModule with init_from's
weights; the Trainer; fit or validate; the test predictions; the results.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf

from lightbert.checkpoints.reading import Pretrained
from lightbert.cluster import processes
from lightbert.data.tokenizer import load_tokenizer
from lightbert.distributed import gather_dict
from lightbert.errors import UserError
from lightbert.plugins.agreement import SameResumeOnEveryNode
from lightbert.plugins.callbacks import FineTuningResume, RunProgressBar
from lightbert.plugins.checkpointing import AtomicCheckpointIO, LatestCheckpoint, ResumableRNG
from lightbert.plugins.launcher import use_run_launcher
from lightbert.plugins.loggers import RunCSVLogger, finish_wandb, summarise_in_wandb
from lightbert.run.instantiation import instantiate_config, parameters_named_by
from lightbert.run.preflight import prepare
from lightbert.run.run_dir import LAST_CHECKPOINT, save_tokenizer, write_results
from lightbert.run.run_dir import results as run_results
from lightbert.run.settings import RunSettings, Start
from lightbert.run.speed import apply_speed_switches, fix_batch_shapes
from lightbert.run.weights import check_head, load_pretrained_weights, with_vocabulary
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule
from lightbert.tasks.pretraining.continued import with_added_words

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
            if "add_words" in settings.task.datamodule:
                tokenizer["add_words"] = None  # the words added when the run began are in it: none are added again
        datamodule, module, _ = _data_and_module(settings, pretrained, model_config, tokenizer)
        # metrics.csv continues from the checkpoint's step, or after every row of an attempt that left no checkpoint
        keep_rows_before = start.step if start.resuming else (math.inf if settings.resume or start.requeued else None)
        loggers = _loggers(config, keep_rows_before)
        if not start.resuming:
            save_tokenizer(datamodule.tokenizer, output_dir)
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
                    datamodule = _datamodule(settings, phase_kwargs, phase.datamodule)
                # Fresh callbacks for each phase: their state comes back from the checkpoint the phase starts from.
                callbacks = [
                    *_callbacks(settings),
                    SameResumeOnEveryNode(output_dir, start.step if start.resuming else None),
                    *([FineTuningResume()] if start.resuming and settings.task.fine_tuning else []),
                ]
                trainer = _trainer(
                    settings, callbacks, loggers, **({"max_steps": phase.end_step} if len(phases) > 1 else {})
                )
                trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
                resume_from = output_dir / LAST_CHECKPOINT  # the next phase starts from this one's weights, optimizer
            results = run_results(trainer, output_dir, time.time() - started)
            results["predictions"] = write_test_predictions(trainer, module, datamodule, output_dir)
            return _finish(trainer, results, output_dir)
    finally:
        finish_wandb()


# What evaluation runs without: it saves no checkpoint and trains no step.
TRAINING_ONLY_CALLBACKS = (ModelCheckpoint, LatestCheckpoint, ResumableRNG, LearningRateMonitor)


def validate(settings: RunSettings, start: Start) -> dict[str, Any]:
    """The evaluation run of held settings: init_from's fine-tuned model on the task's validation splits."""
    started = time.time()
    log.info(f"run directory: {settings.output_dir}")
    pretrained, model_config, config = prepare(settings, start, lambda p: check_head(settings, p), evaluation=True)
    try:
        kwargs = {"tokenizer": pretrained.tokenizer} if pretrained.tokenizer else {}
        if settings.task.fine_tuning:  # fine-tuning data: no training split needed
            kwargs["fit"] = False
        datamodule, module, fresh = _data_and_module(settings, pretrained, model_config, kwargs, training=False)
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
        callbacks = [c for c in _callbacks(settings) if not isinstance(c, TRAINING_ONLY_CALLBACKS)]
        trainer = _trainer(settings, callbacks, _loggers(config))
        with processes.naming_lost_processes(settings.output_dir, training=False):
            trainer.validate(module, datamodule=datamodule)
            results = {
                "evaluated": pretrained.source,
                "metrics": {name: float(value) for name, value in sorted(trainer.callback_metrics.items())},
                "predictions": write_test_predictions(trainer, module, datamodule, settings.output_dir),
                "output_dir": str(settings.output_dir),
                "seconds": round(time.time() - started, 1),
            }
            return _finish(trainer, results, settings.output_dir)
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


def _datamodule(settings: RunSettings, kwargs: dict, changes: dict | None = None):
    """The task's DataModule (a phase's `changes` to task.datamodule applied), with batches of the shapes the speed
    switches need (said once, for the first). Partial, then called: objects passed through instantiate() would be
    turned into configs."""
    with parameters_named_by(settings.task.datamodule):
        datamodule = instantiate_config(settings.task.datamodule, **(changes or {}), _partial_=True)(**kwargs)
        datamodule.tokenizer  # noqa: B018  (its first use: a bad tokenizer_path is named as the key here)
    shapes = fix_batch_shapes(datamodule, settings.speed)
    if shapes and changes is None:
        log.info(shapes)
    return datamodule


def _data_and_module(
    settings: RunSettings, pretrained: Pretrained | None, model_config: dict, kwargs: dict, training: bool = True
):
    """The task's DataModule and LightningModule, the module holding init_from's weights; and the fresh ones."""
    datamodule = _datamodule(settings, kwargs)
    growth = None
    if pretrained is not None:  # rows for the words task.datamodule.add_words added to its tokenizer
        pretrained, growth = with_added_words(pretrained, datamodule.tokenizer)
    module = instantiate_config(
        settings.task.module,
        model=with_vocabulary(model_config, datamodule.tokenizer, pretrained),
        optim=settings.optim,
        _convert_="all",
    )
    fresh = load_pretrained_weights(settings, module, pretrained, growth) if pretrained is not None else []
    apply_speed_switches(module, settings.speed, settings.trainer, settings.task.packing, training)
    return datamodule, module, fresh


def _callbacks(settings: RunSettings) -> list:
    return [instantiate_config(c) for c in settings.callbacks]


def _loggers(config: DictConfig, resumed_step: float | None = None) -> list:
    """The loggers of the config as recorded (`preflight.prepare`), each given it whole as hyperparameters."""
    loggers = [instantiate_config(c) for c in (config.get("logger") or {}).values()]
    for logger in loggers:  # the resolved config, and the command line that made it
        if isinstance(logger, RunCSVLogger) and resumed_step is not None:
            logger.resumed_step = resumed_step  # metrics.csv continues from the checkpoint's step
        logger.log_hyperparams(OmegaConf.to_container(config, resolve=True))
    return loggers


def _trainer(settings: RunSettings, callbacks: list, loggers: list, **overrides: Any) -> L.Trainer:
    if settings.trainer.progress_bar and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks = [*callbacks, RunProgressBar()]  # lightbert's bar, not Lightning's default (Rich where installed)
    overrides.setdefault("accumulate_grad_batches", settings.batches.accumulate)
    plugins = [instantiate_config(p) for p in settings.trainer.config.get("plugins") or []]
    trainer = instantiate_config(
        settings.trainer.config,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO(), *plugins],
        **overrides,
    )
    use_run_launcher(trainer)  # a DDP process that dies is named, not a SIGKILL of the whole job
    return trainer


def write_test_predictions(trainer, module, datamodule, output_dir: Path) -> list[str]:
    """Predict the task's prediction splits with the best checkpoint and write their files, as the DataModule
    declares (`predict_splits`, `prediction_writer`; pre-training and SWAG declare none). Returns the files.

    Each prediction is one example's row of the batch's "prediction" (a class, a score, or a QA window's logits),
    as a numpy array so that gathering from other devices pickles just that row.
    """
    if not isinstance(datamodule, FineTuningDataModule):
        return []  # pre-training predicts nothing after training
    splits = datamodule.predict_splits
    if not splits or datamodule.prediction_writer() is None:
        return []
    checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.monitor), None)
    ckpt_path = checkpoint.best_model_path if checkpoint is not None and checkpoint.best_model_path else None
    batches = trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    if len(splits) == 1:
        batches = [batches]
    predictions = {}
    for split, split_batches in zip(splits, batches, strict=True):
        by_idx = {}
        for out in split_batches:
            prediction = out["prediction"].detach().cpu()
            if prediction.is_floating_point():
                prediction = prediction.float()  # numpy has no bfloat16
            by_idx.update(zip(out["idx"].tolist(), prediction.numpy(), strict=True))
        predictions[split] = gather_dict(by_idx)  # each rank predicted its share of every split
    if trainer.global_rank != 0:
        return []
    written = datamodule.prediction_writer().write(predictions, output_dir / "predictions")
    return [str(p) for p in written]


def _metric_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(newline="") as file:
        return max(0, sum(1 for _ in file) - 1)


def _finish(trainer: L.Trainer, results: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """results.json and the console's last line, the W&B summary, and the end of the process group."""
    write_results(results, output_dir)
    summarise_in_wandb(trainer, results)
    _end_distributed()
    return results


def _end_distributed() -> None:
    """Ends the process group Lightning's DDP started, once every process has finished (a failed run leaves it to
    the exit, as a barrier could wait for a process that is gone). Left to the interpreter's exit, gloo's threads
    were seen to abort a finished DDP run ("terminate called without an active exception", exit -6)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no process leaves while another still gathers predictions
        processes.job_done()  # past the last collective: a process that ends now has done its part
        torch.distributed.destroy_process_group()
