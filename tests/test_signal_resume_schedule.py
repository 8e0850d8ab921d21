"""A run stopped by a signal and resumed keeps an unbroken run's schedule: the same validation steps, the same logged
step numbers, the same epoch ends, the same last step (and the same losses, bit for bit).

The checkpoint of a signal stop is saved at the start of the batch after the last step (`LatestCheckpoint`), when
Lightning has already counted that batch as fetched. Restored as it was, the resumed run counted one batch more than
it had trained: it validated a step early (at 7 instead of 8 with val_check_interval=4), logged every row one step
number higher (the last step of max_steps=12 as 13, with a number skipped), and each further signal stop added one
more (validations at 4, 7 and 10 after the two stops here)."""

from __future__ import annotations

import csv
import json
import re
import signal
from pathlib import Path

import pytest
from helpers.loss_recorder import recorded
from helpers.runs import BASE, run_train_recorded, write_bert_corpus

from lightbert.plugins.checkpointing import as_saved_at_the_last_batch_end

BATCHES_PER_EPOCH = 8  # of the corpus below at these settings: the second stop is at the end of the first epoch


def run_args(corpus: Path, run_dir: Path, losses: Path) -> list[str]:
    args = [a for a in BASE if not a.startswith(("trainer.val_check_interval", "task.checkpoint_every_n_steps"))]
    record = ["+callbacks.record._target_=helpers.loss_recorder.RecordLosses", f"+callbacks.record.path={losses}"]
    return [*args, f"corpus.paths=[{corpus}]", "trainer.max_steps=12", "trainer.val_check_interval=4",
            "task.checkpoint_every_n_steps=100",  # no periodic checkpoint: only the signals'
            "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}", *record]  # fmt: skip


def schedule(run_dir: Path) -> dict:
    """What the run's files say of when things happened: the (step, epoch) of every training row and of every
    validation row of metrics.csv, the steps at which it validated (train.log, which every attempt appends to), and
    the last step (results.json)."""
    rows = [{k: v for k, v in row.items() if v} for row in csv.DictReader((run_dir / "metrics.csv").open())]
    return {
        "training": sorted((int(row["step"]), int(row["epoch"])) for row in rows if "train/loss" in row),
        "validation": sorted((int(row["step"]), int(row["epoch"])) for row in rows if "val/loss" in row),
        "validated": [int(n) for n in re.findall(r"validation at step (\d+):", (run_dir / "train.log").read_text())],
        "global_step": json.loads((run_dir / "results.json").read_text())["global_step"],
    }


@pytest.mark.slow
def test_a_run_stopped_by_signals_and_resumed_keeps_the_unbroken_schedule(tmp_path):
    """SIGTERM after step 5 (mid-epoch, a step after a validation), resumed; SIGTERM again after step 8 (the first
    epoch's last batch and a validation step), resumed to max_steps=12."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10)
    unbroken = run_train_recorded(*run_args(corpus, tmp_path / "unbroken", tmp_path / "unbroken.txt"))
    assert unbroken.returncode == 0, unbroken.stderr[-3000:]
    reference = schedule(tmp_path / "unbroken")
    # Lightning logs the rows of step n as step n - 1; the first epoch's rows are the first BATCHES_PER_EPOCH.
    assert reference["training"] == [(n, int(n >= BATCHES_PER_EPOCH)) for n in range(12)], reference
    assert reference["validation"] == [(3, 0), (7, 0), (11, 1)] and reference["validated"] == [4, 8, 12], reference
    assert reference["global_step"] == 12

    run_dir, losses = tmp_path / "stopped", tmp_path / "stopped.txt"
    args = run_args(corpus, run_dir, losses)
    for attempt, step in enumerate([5, BATCHES_PER_EPOCH]):
        term = ["+callbacks.term._target_=helpers.loss_recorder.SignalAtStep", f"+callbacks.term.step={step}"]
        stopped = run_train_recorded(*args, *term, *(["resume=true"] if attempt else []))
        assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    assert schedule(run_dir) == reference
    assert recorded(losses) == recorded(tmp_path / "unbroken.txt")  # every step trained once, bit for bit


def loops(ready: int, started: int, processed: int, completed: int, stepped: int, last: bool = False) -> dict:
    """The part of a checkpoint's `loops` that a stop at a batch's start changes (one epoch: current == total)."""
    counts = {"ready": ready, "started": started, "processed": processed, "completed": completed}
    return {"loops": {"fit_loop": {
        "epoch_loop.state_dict": {"_batches_that_stepped": stepped},
        "epoch_loop.batch_progress": {"total": dict(counts), "current": dict(counts), "is_last_batch": last},
    }}}  # fmt: skip


def test_a_checkpoint_saved_at_a_batch_start_holds_the_counters_of_the_batch_before_its_end():
    """The counters of a SIGTERM's last.ckpt after step 5, as lightbert saved them before (and still loads them), are
    set to those of the checkpoint that task.checkpoint_every_n_steps=5 saves at step 5's end; that one, and one set
    back already, are left as they are."""
    stopped, at_the_end = loops(6, 5, 5, 5, stepped=5), loops(5, 5, 5, 4, stepped=4)
    as_saved_at_the_last_batch_end(stopped)
    assert stopped == at_the_end
    as_saved_at_the_last_batch_end(stopped)
    assert stopped == loops(5, 5, 5, 4, stepped=4)
    finished = loops(12, 12, 12, 12, stepped=12, last=True)  # saved at the end of training
    as_saved_at_the_last_batch_end(finished)
    assert finished == loops(12, 12, 12, 12, stepped=12, last=True)
