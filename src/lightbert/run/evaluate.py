"""`evaluate(cfg)`: a fine-tuned model scored on its task's validation splits, read top to bottom in one function.
`python src/evaluate.py` (and `lightbert-evaluate`) calls it; so do notebooks and tests (`lightbert.evaluate`).

The order of a training run (`run.train`), without training: the settings, the run directory (a new one), the checks
on this machine, the seed, init_from with the task's head, the record and the run line, the DataModule and the
LightningModule, the Trainer, validate, the prediction files and the results. The checkpoint's own run directory is
never touched.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from omegaconf import DictConfig

from lightbert.cluster import processes
from lightbert.cluster.environment import adopt_submitit_local_ranks
from lightbert.errors import UserError
from lightbert.run.config_checks import checked_config
from lightbert.run.console import RunLogFile, logging_like_the_command, quiet_console
from lightbert.run.run_dir import held
from lightbert.run.settings import RunSettings

log = logging.getLogger(__name__)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Score the fine-tuned model `init_from` names on the task's validation splits and write the prediction files a
    training run writes, into a new run directory (`results.json` there), and return the results."""
    adopt_submitit_local_ranks()  # before anything asks which process this is
    # A bad value is refused here, before anything is read or written: the config as a whole, then its parts.
    checked = checked_config(cfg)
    settings = RunSettings.from_config(checked)
    if not settings.init_from:
        raise UserError("src/evaluate.py scores a fine-tuned model: set init_from=<run directory | .ckpt | HF dir>")
    if settings.task.add_words is not None:  # copied from a continued run's command: scored with fresh rows
        raise UserError(
            f"task.datamodule.add_words={settings.task.add_words} belongs to training (src/train.py adds words to "
            "init_from's vocabulary); src/evaluate.py scores init_from with the words it was trained with: drop it"
        )
    output_dir, task = settings.output_dir, settings.task
    processes.install()  # its DataLoader workers and data-preparation pool die with it, and hold no lock
    with logging_like_the_command(output_dir), held(settings, evaluation=True) as start:
        # torch and Lightning load from here on: the command was judged without them.
        import lightning as L

        from lightbert.checkpoints.reading import load_pretrained
        from lightbert.plugins.loggers import finish_wandb, summarise_in_wandb
        from lightbert.run import building, machine_checks
        from lightbert.run.model_choice import check_head, run_model
        from lightbert.run.outputs import write_results, write_test_predictions
        from lightbert.run.record import record_run, recorded_config
        from lightbert.run.run_line import describe_run

        started = time.time()
        quiet_console()
        # The checks on this machine (no fp8's: evaluation trains nothing).
        machine_checks.check_devices(settings)
        machine_checks.check_cache_dir(settings)
        sources = machine_checks.data_sources(settings)  # the data read here, each source with its identity
        # Set before any DataLoader or datasets.map worker forks, so the Rust tokenizer never deadlocks in one.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        L.seed_everything(settings.seed, workers=True)

        # init_from, refused without the task's head, and the model.
        pretrained = load_pretrained(settings.init_from)
        check_head(settings, pretrained)
        model = run_model(settings, start, pretrained)

        # The record, then train.log and the run line.
        config = recorded_config(settings, model.config, model.name)
        record_run(config, settings.overrides, output_dir, start.resuming, False, sources)
        RunLogFile.start()  # train.log from here on, with what was logged while the checks ran
        log.info(describe_run(settings, model.config, True, model.left_to_right, start))

        try:
            # The DataModule (fine-tuning data: no training split needed) and the LightningModule with the weights.
            kwargs = {**model.tokenizer, **({"fit": False} if task.fine_tuning else {})}
            datamodule, _, module, fresh = building.data_and_module(settings, model, kwargs, training=False)
            if fresh:
                raise UserError(
                    f"init_from={settings.init_from} has no fine-tuned {task.name} head: {', '.join(fresh[:3])} would "
                    f"be untrained. Evaluate a model fine-tuned for task={task.option or '...'} (its run directory or "
                    ".ckpt)"
                )
            trained_for = model.pretrained.hyper_parameters.get("task")
            if trained_for and trained_for != task.name:
                log.warning(
                    f"init_from={settings.init_from} was fine-tuned on {trained_for}, and is evaluated on {task.name}"
                )

            # The Trainer, without the callbacks that save checkpoints or train; validate.
            trainer = building.trainer(settings, building.callbacks(settings), building.loggers(config))
            with processes.naming_lost_processes(output_dir, training=False):
                trainer.validate(module, datamodule=datamodule)

                # The outputs: the prediction files and results.json.
                results = {
                    "evaluated": model.pretrained.source,
                    "metrics": {name: float(value) for name, value in sorted(trainer.callback_metrics.items())},
                    "predictions": write_test_predictions(trainer, module, datamodule, output_dir),
                    "output_dir": str(output_dir),
                    "seconds": round(time.time() - started, 1),
                }
                write_results(results, output_dir)
                summarise_in_wandb(trainer, results)
                processes.end_process_group()
                return results
        finally:
            finish_wandb()
