"""The run directory is the user's record, checked with real processes: a refused
command writes nothing, a resume continues the run as recorded (its tokenizer, its settings, its metrics.csv),
and two runs never share a directory."""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path

import pytest
from helpers.runs import (
    BASE,
    REPO,
    forked,
    pythonpath_with_tests,
    run_train_recorded,
    snapshot,
    write_bert_corpus,
)
from omegaconf import OmegaConf

from lightbert.run.run_dir import RECORD_DIR, check_output_dir

pytestmark = pytest.mark.slow


def metric_steps(run_dir: Path) -> list[int]:
    rows = csv.DictReader((run_dir / "metrics.csv").read_text().splitlines())
    return [int(row["step"]) for row in rows if row.get("train/loss")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=10)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, corpus) -> tuple[Path, list[str]]:
    """A run killed (SIGKILL) after step 6, its last checkpoint at step 4: what a crash leaves."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    args = [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=10", f"hydra.run.dir={run_dir}"]
    args.append("+logger.csv.flush_logs_every_n_steps=1")  # rows past the checkpoint reach the disk before the kill
    killed = run_train_recorded(
        *args, "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=6", new_session=True
    )
    assert killed.returncode == -signal.SIGKILL
    return run_dir, args


def test_a_refused_command_leaves_a_finished_run_as_it_was(tmp_path, corpus):
    run_dir = tmp_path / "run"
    args = [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=2", f"hydra.run.dir={run_dir}"]
    assert run_train_recorded(*args).returncode == 0
    before = snapshot(run_dir)
    assert {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "train.log"} <= set(before)
    again = run_train_recorded(*args, "optim.lr=1e-3")
    assert again.returncode == 2 and "already holds a finished run" in again.stderr
    after = snapshot(run_dir)
    assert after == before, (run_dir / "train.log").read_text()[-1500:]  # not one byte: not .hydra/, not train.log


def recorded_by_an_older_version(run_dir: Path) -> None:
    """The run's record as a lightbert without the speed.fp8 setting wrote it, from when speed.compile's default was
    false (now null: by the device; a resume may compile or not)."""
    config = run_dir / ".hydra" / "config.yaml"
    recorded = OmegaConf.load(config)
    if "fp8" in recorded.speed:
        del recorded.speed["fp8"]
    recorded.speed.compile = False
    config.write_text(OmegaConf.to_yaml(recorded))


def test_a_resume_that_changes_settings_is_refused_and_writes_nothing(killed_run, tmp_path):
    run_dir, args = killed_run
    recorded_by_an_older_version(run_dir)  # a setting new since the run started: set on the command line, a change
    before = snapshot(run_dir)
    other_corpus = write_bert_corpus(tmp_path / "other.txt", num_documents=12, seed=3)
    changes = [("optim.lr=1e-3", "optim.lr"), (f"corpus.paths=[{other_corpus}]", "corpus.paths")]
    for change, key in [*changes, ("speed.fp8=true", "speed.fp8: None recorded, True now")]:
        refused = run_train_recorded(*args, "resume=true", change)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "resume=true continues the run" in refused.stderr and key in refused.stderr
        if key == "optim.lr":  # a recorded setting: how to set it back, as the command line writes it
            assert "or set them back as recorded (optim.lr=" in refused.stderr, refused.stderr[-1000:]
        if key.startswith("speed.fp8"):  # new since the run started: no recorded value to set back
            assert "set them back" not in refused.stderr, refused.stderr[-1000:]
        assert snapshot(run_dir) == before


def test_a_resume_continues_metrics_csv_and_keeps_the_runs_tokenizer(killed_run):
    run_dir, args = killed_run
    recorded_by_an_older_version(run_dir)  # a setting new since the run started, at its default: resumes
    tokenizer = (run_dir / "tokenizer.json").read_bytes()
    assert metric_steps(run_dir)[-1] >= 4  # logged past the checkpoint at step 4 (rows 0-3): those rows are redone
    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = metric_steps(run_dir)
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 9  # one row per step, history kept
    assert (run_dir / "tokenizer.json").read_bytes() == tokenizer


def test_a_fresh_run_into_a_directory_with_a_users_metrics_csv_is_refused(tmp_path, corpus):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step,my/metric\n0,1.0\n")
    before = snapshot(run_dir)
    refused = run_train_recorded(*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    assert refused.returncode == 2 and "holds a metrics.csv" in refused.stderr
    assert snapshot(run_dir) == before


def test_two_runs_in_one_directory_the_second_is_refused(tmp_path, corpus):
    run_dir = tmp_path / "run"
    args = [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=100000", f"hydra.run.dir={run_dir}"]
    # The first run: `python src/train.py` forked (helpers.fork_server), a process of its own that is still training
    # while the second starts; the subject is the second command's refusal, not how the first was started.
    files = tmp_path / "first"
    files.mkdir()
    task = {"env": {**os.environ, "PYTHONPATH": pythonpath_with_tests()}, "cwd": str(REPO), "stdin": None,
            "stdout": str(files / "stdout"), "stderr": str(files / "stderr"), "new_session": False,
            "file_size_limit": None}  # fmt: skip
    job, pids = forked.start("train", args, [task])
    try:
        deadline = time.time() + 300
        while not (run_dir / ".hydra" / "config.yaml").is_file():  # the first has passed its checks
            assert forked.replies[job].empty() and time.time() < deadline, "the first run ended before it started"
            time.sleep(0.2)
        second = run_train_recorded(*args)
        assert second.returncode == 2 and "another run is training in" in second.stderr
    finally:
        os.kill(pids[0], signal.SIGINT)
        (returncode,) = forked.wait(job, pids, 300)
    assert returncode in (0, 130), (files / "stderr").read_text()[-3000:]  # stopped by Ctrl-C, or finished


def test_a_resume_without_a_checkpoint_keeps_the_earlier_attempts_metrics(tmp_path, corpus):
    """Killed before its first checkpoint, a run leaves metrics.csv rows and no last.ckpt: resume=true starts from
    the beginning and metrics.csv keeps those rows, the new ones after them."""
    run_dir = tmp_path / "run"
    base = [a for a in BASE if not a.startswith(("trainer.val_check_interval", "task.checkpoint_every_n_steps"))]
    args = [*base, f"corpus.paths=[{corpus}]", "trainer.max_steps=6", "task.checkpoint_every_n_steps=100"]
    args += ["trainer.val_check_interval=100", f"hydra.run.dir={run_dir}", "+logger.csv.flush_logs_every_n_steps=1"]
    kill = ["+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=3"]
    assert run_train_recorded(*args, *kill, new_session=True).returncode == -signal.SIGKILL
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
    before = (run_dir / "metrics.csv").read_text().splitlines()
    earlier = metric_steps(run_dir)
    assert earlier and earlier == list(range(len(earlier)))  # the rows that reached the disk before the kill

    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"metrics.csv keeps the {len(before) - 1} row(s) of the earlier attempt" in resumed.stdout + resumed.stderr
    after = (run_dir / "metrics.csv").read_text().splitlines()
    assert after[1 : len(before)] == before[1:]  # the earlier attempt's rows, as they were
    assert metric_steps(run_dir) == [*earlier, 0, 1, 2, 3, 4, 5]


def test_a_resume_on_an_edited_corpus_is_refused_and_names_it(tmp_path):
    """The corpus rewritten in place with the same size and its old modification time (as `cp -p` or `rsync -a`
    leave it): the resumed run would continue on other examples, so it is refused, and the record is untouched."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=5)
    run_dir = tmp_path / "run"
    args = [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=8", f"hydra.run.dir={run_dir}"]
    kill = ["+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=5"]
    assert run_train_recorded(*args, *kill, new_session=True).returncode == -signal.SIGKILL
    stat = corpus.stat()
    text = corpus.read_text()
    corpus.write_text(text.replace("the", "teh", 1))  # same size, other words
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    before = snapshot(run_dir)
    refused = run_train_recorded(*args, "resume=true")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert f"sources changed since ({corpus}" in refused.stderr
    assert snapshot(run_dir) == before


def test_a_resumed_run_logs_every_row_an_unbroken_run_logs(tmp_path, corpus):
    """Logged every 10 steps, killed at step 6 before any row reached the disk, resumed from its step-4 checkpoint:
    metrics.csv holds the same rows (step and metric names) as a run that never stopped."""
    base = [a for a in BASE if not a.startswith("trainer.log_every_n_steps")]
    args = [*base, f"corpus.paths=[{corpus}]", "trainer.max_steps=20", "trainer.val_check_interval=100"]

    def rows(run_dir: Path) -> list[tuple[int, tuple[str, ...]]]:
        table = csv.DictReader((run_dir / "metrics.csv").read_text().splitlines())
        return [(int(r["step"]), tuple(sorted(k for k, v in r.items() if v and k != "epoch"))) for r in table]

    assert run_train_recorded(*args, f"hydra.run.dir={tmp_path / 'whole'}").returncode == 0
    kill = ["+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=6"]
    crashed = [*args, f"hydra.run.dir={tmp_path / 'crashed'}"]
    assert run_train_recorded(*crashed, *kill, new_session=True).returncode == -signal.SIGKILL
    assert run_train_recorded(*crashed, "resume=true").returncode == 0
    assert rows(tmp_path / "crashed") == rows(tmp_path / "whole")


def test_a_record_the_jobs_first_process_writes_during_the_check_makes_it_a_runs_directory(tmp_path, monkeypatch):
    """A SLURM job's tasks start at the same moment in one run directory: the first process writes the record
    (.hydra/) while another task checks the directory. That record is a run's, not a foreign file: the task goes on
    (it had refused, and the first process then waited at the rendezvous for a task that had ended)."""
    run = tmp_path / "run"
    run.mkdir()
    list_directory = Path.iterdir

    def the_first_process_writes_the_record_meanwhile(self):
        if self == run:
            (run / RECORD_DIR).mkdir(exist_ok=True)
        return list_directory(self)

    monkeypatch.setattr(Path, "iterdir", the_first_process_writes_the_record_meanwhile)
    assert check_output_dir(run, resume=False) is None
