"""Loggers built from config. W&B never prompts: without credentials it runs offline."""

from __future__ import annotations

import csv
import hashlib
import inspect
import logging
import math
import netrc
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from lightbert.errors import UserError
from lightbert.files import open_atomically

log = logging.getLogger(__name__)

WANDB_MODES = ("auto", "online", "offline", "disabled")


def wandb_has_credentials() -> bool:
    """True when W&B could log in without asking: an API key in the environment or in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        hosts = netrc.netrc(os.environ.get("NETRC", Path.home() / ".netrc")).hosts
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return any("wandb" in host for host in hosts)


def wandb_logger(
    project: str,
    save_dir: str,
    name: str | None = None,
    group: str | None = None,
    tags: list[str] | None = None,
    mode: str = "auto",
    **init_settings,
) -> WandbLogger:
    """A WandbLogger for this run. Any other `wandb.init` setting passes through: `+logger.wandb.entity=myteam`,
    `+logger.wandb.notes=...`, `+logger.wandb.dir=...`."""
    if mode not in WANDB_MODES:
        raise UserError(f"logger.wandb.mode {mode!r} is not one of {list(WANDB_MODES)}")
    import wandb

    valid = set(inspect.signature(wandb.init).parameters) - {"id", "resume", "reinit", "config"}
    unknown = sorted(set(init_settings) - valid)
    if unknown:
        raise UserError(f"logger.wandb.{unknown[0]} is not a wandb.init setting; valid: {', '.join(sorted(valid))}")
    if mode == "auto":
        mode = os.environ.get("WANDB_MODE") or ("online" if wandb_has_credentials() else "offline")
    # W&B's own console lines (a dozen per run: banner, summary, sync hint) stay off; lightbert says where the run
    # went in one line at the end (`say_where_wandb_went`). `+logger.wandb.settings=...` replaces this.
    init_settings.setdefault("settings", wandb.Settings(silent=True))
    tags = [str(t) for t in tags or [] if t not in (None, "", "None")]  # e.g. no sweep= choice
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        # Every job of a sweep is its own run, named by its number; the sweep is one group, named by the task, the
        # model and the sweep's directory (its start time), so the dashboard groups, compares and averages jobs.
        hydra = HydraConfig.get()
        group = group or (f"{name}-{Path(hydra.sweep.dir).name}" if name else str(hydra.sweep.dir))
        name = f"{name}-{hydra.job.num}" if name else None
        tags.append("multirun")
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    # One W&B run per run directory: a run resumed there (resume=true, a SLURM requeue) continues the same W&B run.
    run_id = hashlib.sha256(str(Path(save_dir).resolve()).encode()).hexdigest()[:16]
    logger = WandbLogger(
        id=run_id,
        resume="allow",
        project=project,
        name=name,
        group=group,
        job_type=init_settings.pop("job_type", "multirun" if "multirun" in tags else "run"),
        tags=tags,
        save_dir=save_dir,
        mode=mode,
        log_model=False,  # checkpoints stay in the run directory; uploading them is the user's choice
        **init_settings,
    )
    # Lightning passes wandb.init an `anonymous` setting even when unset, and wandb warns that it has no effect.
    if logger._wandb_init.get("anonymous") is None:
        logger._wandb_init.pop("anonymous", None)
    return logger


def finish_wandb() -> None:
    """Ends the W&B run, if one was started (also after a failed run: its state is uploaded, not left open), and
    says in one line where it went."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        run = wandb.run
        offline = run.settings.mode == "offline" or getattr(run, "offline", False)
        where = Path(run.dir).parent if run.dir else None
        wandb.finish()
        # A refused command takes back what it wrote, its W&B files with it (`run.run_dir.refused_leaves_nothing`):
        # nothing is left to upload.
        refused = isinstance(sys.exc_info()[1], UserError)
        if offline and where is not None and not refused:
            log.info(f"W&B: saved offline in {where}; upload it with: wandb sync {where}")
        elif not offline and run.url:
            log.info(f"W&B: {run.url}")


@rank_zero_only
def summarise_in_wandb(trainer: L.Trainer, results: dict[str, Any]) -> None:
    """The run's headline numbers in the W&B summary: what the runs table and a sweep's parallel-coordinates
    chart show. `best/<monitor>` is the best validation value (the checkpoint kept), not the last one."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            # An evaluation (src/evaluate.py) trains no step and keeps no best checkpoint.
            summary = {k: results[k] for k in ("global_step", "seconds") if k in results}
            if results.get("monitor") and results.get("best_score") is not None:
                summary[f"best/{results['monitor']}"] = results["best_score"]
            logger.experiment.summary.update(summary)


class HistoryWriter(ExperimentWriter):
    """Lightning's metrics.csv writer, except that it never deletes a row: the run directory is the user's record.

    A resumed run appends to metrics.csv. The rows of the attempt before it that it logs again (those of the steps
    after its checkpoint: the work a kill lost, trained again) move to metrics.attempt-<n>.csv beside it, so that
    metrics.csv holds each step once (what plots and `best_validation_metrics` read) and every row anyone saw is still
    in the run directory. A run that starts again from the beginning (resume=true without a checkpoint,
    `resumed_step` inf) appends after every row. The files change only once the run logs its first metrics."""

    def __init__(self, log_dir: str, resumed_step: float | None):
        self.resumed_step = resumed_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        """Lightning's deletes metrics.csv here, before anything has trained."""

    def save(self) -> None:
        if self.resumed_step is not None and self.metrics:
            if os.path.isfile(self.metrics_file_path):
                self._continue_history()
            # The history is in place (or there was none): append from here on. Left set, a later save would set
            # aside the rows this run has just written.
            self.resumed_step = None
        super().save()

    def _continue_history(self) -> None:
        """metrics.csv as this run continues it: the rows it will not log again, under the header of every column."""
        path = Path(self.metrics_file_path)
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            rows = list(reader)
            header = list(reader.fieldnames or [])
        self.metrics_keys = sorted(set(header) | set(self.metrics_keys))
        # The rows this run logs again are those numbered from its first row on, not from the checkpoint's step: the
        # cut holds however Lightning numbers a resumed run's rows. (A checkpoint a signal saved at a batch's start
        # numbered them one ahead, until `checkpointing.as_saved_at_the_last_batch_end`; cut at the checkpoint's
        # step, a later resume from step N then deleted the rows of step N, its validation among them: issue 71.)
        # From the beginning (inf), every row stays.
        first = math.inf if self.resumed_step == math.inf else min(_step(row) for row in self.metrics)
        again = [row for row in rows if _step(row) >= first]
        if again:
            aside = _next_attempt_file(path)
            # Written before metrics.csv loses them: a crash in between leaves them in both files, never in none.
            with open_atomically(aside, newline="") as file:
                writer = csv.DictWriter(file, fieldnames=header)
                writer.writeheader()
                writer.writerows(again)
            log.info(
                f"metrics.csv: the earlier attempt's {len(again)} row(s) from step {first:g} on, which this run "
                f"logs again, are kept in {aside.name}"
            )
        with open_atomically(path, newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(row for row in rows if _step(row) < first)


def _next_attempt_file(metrics: Path) -> Path:
    """metrics.attempt-<n>.csv beside `metrics`, n the first number not taken (a run killed and resumed twice past
    its checkpoint sets aside two attempts' rows)."""
    n = 1
    while (aside := metrics.with_name(f"{metrics.stem}.attempt-{n}{metrics.suffix}")).exists():
        n += 1
    return aside


def _step(row: dict) -> float:
    try:
        return float(row.get("step") or 0)
    except ValueError:
        return 0.0


class RunCSVLogger(CSVLogger):
    """metrics.csv in the run directory, continued by a resumed run (train() sets `resumed_step`)."""

    resumed_step: int | None = None

    @property
    @rank_zero_experiment
    def experiment(self) -> HistoryWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = HistoryWriter(self.log_dir, self.resumed_step)
        return self._experiment
