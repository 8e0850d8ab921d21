"""A run's processes, with real ones: its helpers (DataLoader workers, the data-preparation pool) die with it and
never hold its directory, so `resume=true` right after a kill -9 is accepted; SIGTERM and Ctrl-C while the data is
prepared end in one line, with nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.runs import BASE, REPO, default_sigint, pythonpath_with_tests, write_bert_corpus

pytestmark = pytest.mark.slow


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies are dead: their parent has not reaped them yet)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def wait_until_gone(pgid: int, seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def start(args: list[str]) -> subprocess.Popen:
    """`python src/train.py ARGS` in a process group of its own, as a terminal's foreground job."""
    env = {**os.environ, "PYTHONPATH": pythonpath_with_tests()}
    return subprocess.Popen(
        [sys.executable, str(REPO / "src" / "train.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
        start_new_session=True,
        preexec_fn=default_sigint,
    )


def finish(args: list[str]) -> subprocess.CompletedProcess:
    process = start(args)
    stdout, stderr = process.communicate(timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_a_resume_right_after_kill9_during_training_with_workers_continues(tmp_path):
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=11)
    run_dir = tmp_path / "run"
    args = [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=10", f"hydra.run.dir={run_dir}"]
    args = [a for a in args if not a.startswith("task.datamodule.num_workers")] + ["task.datamodule.num_workers=2"]
    killed = start([*args, "+callbacks.kill._target_=helpers.loss_recorder.KillMainAtStep", "+callbacks.kill.step=6"])
    killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    assert wait_until_gone(killed.pid) == []  # the two workers died with it

    resumed = finish([*args, "resume=true"])  # at once: nothing holds the directory any more
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "another run is training" not in resumed.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 10


def preparing(args: list[str]) -> subprocess.Popen:
    """A run caught while its data-preparation pool (two workers) is running."""
    process = start(args)
    deadline = time.monotonic() + 300
    while len(group_members(process.pid)) < 3:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the data-preparation pool never started"
        time.sleep(0.02)
    return process


def pool_args(tmp_path: Path, seed: int) -> list[str]:
    # 2,000 documents: enough for datasets.map to run on two processes (one per 1,000 rows).
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=2000, seed=seed)
    return [
        *BASE,
        f"corpus.paths=[{corpus}]",
        "trainer.max_steps=2",
        "task.datamodule.preprocessing_workers=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]


def test_kill9_during_data_preparation_leaves_no_process_and_the_resume_starts(tmp_path):
    args = pool_args(tmp_path, seed=12)
    process = preparing(args)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    assert wait_until_gone(process.pid) == []  # the pool's workers died with it

    started = finish([*args, "resume=true"])
    assert started.returncode == 0, started.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["global_step"] == 2


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_data_preparation_is_one_line_and_leaves_no_process(tmp_path, signum):
    args = pool_args(tmp_path, seed=13 + signum)
    process = preparing(args)
    os.killpg(process.pid, signum)  # as a terminal's Ctrl-C, or a scheduler's SIGTERM to the job
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    stops = [line for line in stderr.splitlines() if "stopped by" in line]
    assert stops == [
        f"lightbert: stopped by {signum.name} before training started. To continue, rerun the same command with "
        f"hydra.run.dir={tmp_path / 'run'} resume=true"
    ]
    assert wait_until_gone(process.pid) == []
