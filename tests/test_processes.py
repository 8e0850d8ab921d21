"""A run's processes, with real ones: its helpers (DataLoader workers, the data-preparation pool) die with it and
never hold its directory, so `resume=true` right after a kill -9 is accepted; SIGTERM and Ctrl-C while the data is
prepared end in one line, with nothing left running.

The runs that are killed or stopped are `python src/train.py` itself, fresh interpreters in a process group of their
own, and so are the DDP processes they launch; the resumes after them, whose subject is the result, are forked
(`helpers.runs.run_train_recorded`), as most of the suite's commands are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import runtime
from helpers.runs import (
    BASE,
    REPO,
    default_sigint,
    group_members,
    pythonpath_with_tests,
    run_train_recorded,
    run_train_script,
    write_bert_corpus,
)

pytestmark = pytest.mark.slow


def wait_until_gone(pgid: int, seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def start(args: list[str]) -> subprocess.Popen:
    """`python src/train.py ARGS` in a process group of its own, as a terminal's foreground job."""
    env = {**os.environ, "PYTHONPATH": pythonpath_with_tests()}
    return subprocess.Popen(
        [runtime.python(), str(REPO / "src" / "train.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
        start_new_session=True,
        preexec_fn=default_sigint,
    )


def test_a_resume_right_after_kill9_during_training_with_workers_continues(tmp_path):
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=11)
    run_dir = tmp_path / "run"
    args = [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=10", f"hydra.run.dir={run_dir}"]
    args = [a for a in args if not a.startswith("task.datamodule.num_workers")] + ["task.datamodule.num_workers=2"]
    killed = start([*args, "+callbacks.kill._target_=helpers.loss_recorder.KillMainAtStep", "+callbacks.kill.step=6"])
    killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    assert wait_until_gone(killed.pid) == []  # the two workers died with it

    resumed = run_train_recorded(*args, "resume=true")  # at once: nothing holds the directory any more
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "another run is training" not in resumed.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 10


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs: while none has left (all are in its process group), its group's other
    members, read from a few /proc files instead of every process's (`group_members`) fifty times a second."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in children.read_text().split()]
        except OSError:
            continue
    return found + [grandchild for child in found for grandchild in descendants(child)]


def preparing(args: list[str]) -> subprocess.Popen:
    """A run caught while its data-preparation pool (two workers) is running."""
    process = start(args)
    deadline = time.monotonic() + 300
    while len(descendants(process.pid)) < 2:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the data-preparation pool never started"
        time.sleep(0.02)
    return process


def pool_args(tmp_path: Path, seed: int) -> list[str]:
    # 8,000 documents (about 4 MB): enough for the tokenizing pool to run two processes (one per 2,000 documents'
    # worth of bytes, datamodule.BYTES_PER_DOCUMENT). The vocabulary is learnt from the first 200 (the same 80-odd
    # hundred words as the rest): its training, before the pool, is not the subject (1.3 CPU-s less a preparation).
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=8000, seed=seed)
    return [
        *BASE,
        f"corpus.paths=[{corpus}]",
        "trainer.max_steps=2",
        "task.datamodule.preprocessing_workers=2",
        "task.datamodule.tokenizer_documents=200",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]


def test_kill9_during_data_preparation_leaves_no_process_and_the_resume_starts(tmp_path):
    args = pool_args(tmp_path, seed=12)
    process = preparing(args)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    assert wait_until_gone(process.pid) == []  # the pool's workers died with it

    started = run_train_recorded(*args, "resume=true")
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


# A run of two DDP processes on CPU, as `python src/train.py trainer.devices=2` starts them: the first launches the
# second (Lightning runs the command line again), checkpoints every 4 steps.
DDP = [*BASE, "trainer.strategy=ddp", "trainer.devices=2", "trainer.max_steps=10", "trainer.enable_progress_bar=false"]


def start_logged(args: list[str], stderr: Path) -> subprocess.Popen:
    """`start`, with stderr to a file that the test reads while the run goes on."""
    env = {**os.environ, "PYTHONPATH": pythonpath_with_tests()}
    return subprocess.Popen([runtime.python(), str(REPO / "src" / "train.py"), *args], stdout=subprocess.DEVNULL,
                            stderr=stderr.open("w"), text=True, cwd=REPO, env=env, start_new_session=True,
                            preexec_fn=default_sigint)  # fmt: skip


def launched_rank(pid: int) -> int | None:
    """The DDP process that `pid` launched (its child with LOCAL_RANK=1), once it exists."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"LOCAL_RANK=1" in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
                return int(child)
        except OSError:
            continue
    return None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_the_ddp_processes_meet_is_one_line_and_leaves_no_process(tmp_path, signum):
    """SIGTERM to the first process once the second is joining the process group, or Ctrl-C (to the whole group, as
    a terminal sends it) while the second is still starting, the first's launch not over yet: the first says its
    one line; the second prints nothing (it printed c10d's C++ frame dump and a DistNetworkError traceback, or a
    KeyboardInterrupt traceback) and is not left waiting for a rendezvous that will never come (a Ctrl-C in the
    launch left it so: seen in CI, 1 run in about 10)."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=21)
    log = tmp_path / "stderr"
    args = [*DDP, f"corpus.paths=[{corpus}]", f"hydra.run.dir={tmp_path / 'run'}"]
    if signum == signal.SIGINT:
        args += ["+callbacks.stop._target_=helpers.loss_recorder.SignalWhileLaunching", "+callbacks.stop.name=INT"]
    process = start_logged(args, log)
    deadline = time.monotonic() + 300
    while signum == signal.SIGTERM and (
        launched_rank(process.pid) is None or "GLOBAL_RANK: 1" not in log.read_text()  # about to meet the first
    ):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    if signum == signal.SIGTERM:
        os.kill(process.pid, signum)
    process.wait(timeout=120)
    assert wait_until_gone(process.pid, seconds=30) == [], "left running: the second process"
    stderr = log.read_text()
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr and "frame #" not in stderr, stderr[-3000:]
    stops = [line for line in stderr.splitlines() if line.startswith("lightbert:")]
    assert stops == [
        f"lightbert: stopped by {signum.name} before training started. To continue, rerun the same command with "
        f"hydra.run.dir={tmp_path / 'run'} resume=true"
    ], stderr[-3000:]


@pytest.mark.parametrize("when", ["mid-run", "at the end"])
def test_the_first_ddp_process_killed_the_second_names_it_and_the_checkpoint_it_resumes_from(tmp_path, when):
    """kill -9 (or the out-of-memory killer) of the first process, which launched the second: mid-run (step 6, the
    checkpoint of step 4 written) or once training has ended (the checkpoint of step 10 written, the results not).
    The second process says in one line which process died and what is saved (it printed gloo's "Connection reset
    by peer" traceback through Hydra's handler, from the stop agreement or the end's barrier); resume=true continues
    from that checkpoint."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=22)
    run = tmp_path / "run"
    args = [*DDP, f"corpus.paths=[{corpus}]", f"hydra.run.dir={run}"]
    kill = (
        ["+callbacks.kill._target_=helpers.loss_recorder.KillRankAtStep", "+callbacks.kill.step=6",
         "+callbacks.kill.rank=0"]
        if when == "mid-run"
        else ["+callbacks.kill._target_=helpers.loss_recorder.KillRankAtTrainEnd", "+callbacks.kill.rank=0"]
    )  # fmt: skip
    process = start([*args, *kill])
    _, stderr = process.communicate(timeout=600)  # its end: when the second process, which shares it, has ended too
    killed = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)
    assert killed.returncode == -signal.SIGKILL
    assert wait_until_gone(process.pid, seconds=30) == []
    assert "Traceback" not in killed.stderr, killed.stderr[-3000:]
    step = 4 if when == "mid-run" else 10
    said = [line for line in killed.stderr.splitlines() if line.startswith("lightbert:")]
    assert said == [
        "lightbert: error: DDP process 0 of 2 (the first of this node, which started this one) ended without "
        "finishing: killed (kill -9, or the kernel's out-of-memory killer) or crashed; the newest checkpoint, "
        f"{run / 'checkpoints' / 'last.ckpt'} (step {step}), is kept; to continue, rerun the same command with "
        f"hydra.run.dir={run} resume=true"
    ], killed.stderr[-3000:]

    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {step}" in resumed.stdout
    assert json.loads((run / "results.json").read_text())["global_step"] == 10


def test_the_first_ddp_process_killed_while_it_launches_the_second_ends_it_with_one_line(tmp_path):
    """kill -9 of the first process right after it started the second, which then starts with no launcher to watch:
    it ends within a second of looking, with the line, instead of waiting 30 minutes for the rendezvous."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=24)
    kill = ["+callbacks.kill._target_=helpers.loss_recorder.SignalWhileLaunching", "+callbacks.kill.name=KILL"]
    process = start([*DDP, f"corpus.paths=[{corpus}]", f"hydra.run.dir={tmp_path / 'run'}", *kill])
    _, stderr = process.communicate(timeout=120)  # its end: when the second process, which shares it, has ended too
    assert process.returncode == -signal.SIGKILL
    assert wait_until_gone(process.pid, seconds=30) == []
    assert "Traceback" not in stderr, stderr[-3000:]
    said = [line for line in stderr.splitlines() if line.startswith("lightbert:")]
    assert said == [
        "lightbert: error: DDP process 0 of 2 (the first of this node, which started this one) ended without "
        "finishing: killed (kill -9, or the kernel's out-of-memory killer) or crashed; no checkpoint was saved "
        f"before it; rerun the same command with hydra.run.dir={tmp_path / 'run'} resume=true to start again"
    ], stderr[-3000:]


def test_the_second_ddp_process_killed_at_the_last_step_leaves_the_newest_checkpoint_and_one_line(tmp_path):
    """kill -9 of the second process at the last step (10; checkpoints at 4 and 8), as the out-of-memory killer ends
    one rank: the first says in one line which process died, how, what to change, and what is saved, and the
    checkpoint is there to resume from. Lightning's watch SIGKILLed the first process within 5 s of the death,
    wherever it was: exit 137 and no line (seen at the end of a run)."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=23)
    run = tmp_path / "run"
    args = [*DDP, f"corpus.paths=[{corpus}]", f"hydra.run.dir={run}"]
    kill = ["+callbacks.kill._target_=helpers.loss_recorder.KillRankAtStep", "+callbacks.kill.step=10"]
    killed = run_train_script(*args, *kill, start_new_session=True, PYTHONPATH=pythonpath_with_tests())
    assert killed.returncode == 2, killed.stderr[-3000:]
    assert "Traceback" not in killed.stderr, killed.stderr[-3000:]
    said = [line for line in killed.stderr.splitlines() if line.startswith("lightbert:")]
    assert len(said) == 1, said
    step = int(said[0].split("last.ckpt (step ")[1].split(")")[0])
    assert step in (8, 10), said  # the step-10 save needs both processes: it may or may not have been written
    assert said == [  # the kernel's out-of-memory killer sends SIGKILL: the line says what to change
        "lightbert: error: DDP process 1 of 2 was killed by SIGKILL, which is what the kernel's out-of-memory killer "
        "sends: each process holds the whole model, its gradients and the optimizer's state; use a smaller model= or "
        f"fewer trainer.devices; the newest checkpoint, {run / 'checkpoints' / 'last.ckpt'} (step {step}), is kept; "
        f"to continue, rerun the same command with hydra.run.dir={run} resume=true"
    ]

    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {step}" in resumed.stdout
    assert json.loads((run / "results.json").read_text())["global_step"] == 10
