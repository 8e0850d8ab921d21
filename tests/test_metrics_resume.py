"""metrics.csv across resumes, with real runs (issue 71, case 3): a resumed run appends to metrics.csv and never
deletes a row. The rows of the attempt before it that the resumed run logs again (the steps after its checkpoint)
are set aside in metrics.attempt-<n>.csv, so metrics.csv holds each step once and every row is still there.

The trigger of the lost rows: a run stopped by a signal (SIGTERM, as SLURM preempts) and resumed logs each step's
rows at the step's own number from then on, one more than an unbroken run does (Lightning restores its count of
logged steps one ahead from a checkpoint saved at a batch's start). A later resume from a checkpoint at step N then
dropped the rows numbered N (the training and validation rows of step N itself), which it does not log again."""

from __future__ import annotations

import csv
import re
import signal
from pathlib import Path

import pytest
import torch
from helpers.runs import BASE, run_train_recorded, write_bert_corpus

pytestmark = pytest.mark.slow


def table(path: Path) -> list[dict[str, str]]:
    """A CSV file's rows, each with its non-empty cells only (a header that gains a column leaves a row as it was)."""
    return [{k: v for k, v in row.items() if v} for row in csv.DictReader(path.read_text().splitlines())]


def validation_steps(rows: list[dict[str, str]]) -> list[int]:
    return [int(row["step"]) for row in rows if "val/loss" in row]


def training_steps(rows: list[dict[str, str]]) -> list[int]:
    return [int(row["step"]) for row in rows if "train/loss" in row]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=10)


def validations_made(run_dir: Path) -> list[int]:
    """The steps at which the run validated, each once (a validation that a resumed run made again counts once), as
    train.log says (every attempt appends to it)."""
    return sorted({int(n) for n in re.findall(r"validation at step (\d+):", (run_dir / "train.log").read_text())})


def test_a_resume_after_a_signal_stop_keeps_the_validation_row_of_its_checkpoints_step(tmp_path, corpus):
    """SIGTERM after step 3, resumed; killed (SIGKILL) at step 10 with a validation and last.ckpt at step 8, resumed
    again. No row is deleted: the step-8 rows (its validation among them, which the resumed run does not make again)
    stay in metrics.csv, and the killed attempt's rows of the steps trained again are kept in metrics.attempt-1.csv.
    metrics.csv holds one row per step trained and one per validation made."""
    run_dir = tmp_path / "run"
    args = [a for a in BASE if not a.startswith(("trainer.val_check_interval", "task.checkpoint_every_n_steps"))]
    args += [f"corpus.paths=[{corpus}]", "trainer.max_steps=10", "trainer.val_check_interval=3",
             "task.checkpoint_every_n_steps=4", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}",
             "+logger.csv.flush_logs_every_n_steps=1"]  # fmt: skip
    # Every row reaches the disk as it is logged (flush_logs_every_n_steps=1): the kill loses none.
    term = ["+callbacks.stop._target_=helpers.loss_recorder.SignalAtStep", "+callbacks.stop.step=3"]
    stopped = run_train_recorded(*args, *term)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]

    kill = ["+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=10"]
    killed = run_train_recorded(*args, "resume=true", *kill, new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8
    # Here a validation ran at step 8 too, before last.ckpt of step 8 was saved: the resume does not make it again.
    before = table(run_dir / "metrics.csv")

    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = table(run_dir / "metrics.csv")
    set_aside = sorted(run_dir.glob("metrics.attempt-*.csv"))
    earlier_attempt = table(set_aside[0]) if set_aside else []

    # Every row the user saw before the resume is still in the run directory, with the same values: in metrics.csv,
    # or, for the steps the resumed run trained again, in metrics.attempt-1.csv (the killed attempt's step 9 at least).
    missing = [row for row in before if row not in after and row not in earlier_attempt]
    assert missing == [], missing
    assert [p.name for p in set_aside] == ["metrics.attempt-1.csv"], set_aside
    assert earlier_attempt and all(row in before for row in earlier_attempt), earlier_attempt
    # metrics.csv: one row per step trained (logged every step) and one per validation made, in order.
    steps = training_steps(after)
    assert len(steps) == 10 and steps == sorted(set(steps)), steps
    assert len(validation_steps(after)) == len(validations_made(run_dir)), (validations_made(run_dir), after)
    assert validation_steps(after) == sorted(set(validation_steps(after))), after
