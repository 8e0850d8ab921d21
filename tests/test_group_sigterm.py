"""SIGTERM to a training run's whole process group, as `scancel`, SLURM's time limit and `docker stop` deliver it,
ends as SIGTERM to the main process does: after the current batch, with last.ckpt saved at that step, one line
that says how to continue, and exit 143 (issue 71, case 5). The DataLoader workers get the signal too: torch's own
handler in a worker ended it, and the run died mid-batch of "DataLoader worker ... exited unexpectedly", with no
checkpoint.

The run is `python src/train.py` itself, a fresh interpreter in a process group of its own, signalled from outside
(`os.killpg`) once it has trained a few steps."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from helpers import runtime
from helpers.runs import (
    REPO,
    TINY_PRETRAIN,
    default_sigint,
    group_members,
    pythonpath_with_tests,
    write_bert_corpus,
)
from lightning.fabric.utilities.seed import pl_worker_init_function, seed_everything
from torch.utils.data import DataLoader

from lightbert.cluster.processes import dataloader_worker_init

pytestmark = pytest.mark.slow

# No checkpoint or validation of its own before the signal: a last.ckpt can only be the signal's.
ARGS = [
    *(a for a in TINY_PRETRAIN if not a.startswith("task.datamodule.num_workers")),
    "trainer.max_steps=100000",
    "trainer.val_check_interval=100000",
    "task.checkpoint_every_n_steps=100000",
    "trainer.enable_progress_bar=false",
    "+callbacks.steps._target_=helpers.loss_recorder.RecordLosses",  # a line per trained step, flushed at once
]
TRAINED_STEPS_BEFORE_THE_SIGNAL = 3
PATIENCE = 120  # seconds from the signal to the end of the run; a hang never ends


def trained_steps(record: Path) -> list[int]:
    """The steps `RecordLosses` has recorded so far (a line being written is not one yet)."""
    lines = record.read_text().split("\n")[:-1] if record.exists() else []
    return [int(line.split()[0]) for line in lines]


@pytest.mark.parametrize("num_workers", [2, 0], ids=["2-workers", "no-workers"])
def test_sigterm_to_the_process_group_stops_after_the_batch_with_a_checkpoint(tmp_path, num_workers):
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=16)
    run_dir, record = tmp_path / "run", tmp_path / "steps"
    args = [*ARGS, f"task.datamodule.num_workers={num_workers}", f"corpus.paths=[{corpus}]",
            f"+callbacks.steps.path={record}", f"hydra.run.dir={run_dir}"]  # fmt: skip
    process = subprocess.Popen(
        [runtime.python(), str(REPO / "src" / "train.py"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath_with_tests()},
        start_new_session=True,  # the run's own group, as a job's: the signal reaches nothing else
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 300
        while len(trained_steps(record)) < TRAINED_STEPS_BEFORE_THE_SIGNAL:
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never trained"
            time.sleep(0.02)
        # The workers are up (persistent), in the group beside the main process: they get the signal too.
        assert len(group_members(process.pid)) >= 1 + num_workers
        before = trained_steps(record)[-1]
        os.killpg(process.pid, signal.SIGTERM)
        after = trained_steps(record)[-1]  # the step in flight when the signal came is at most the one after this
        _, stderr = process.communicate(timeout=PATIENCE)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    stops = [line for line in stderr.splitlines() if "stopped by" in line]
    assert stops == [
        f"lightbert: stopped by SIGTERM; the latest state is in {run_dir}/checkpoints/last.ckpt. To continue, rerun "
        f"the same command with hydra.run.dir={run_dir} resume=true"
    ], stderr[-3000:]
    # Saved at the signal: the state after the batch that was running, the last one trained; none trained after it.
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"]
    assert saved == trained_steps(record)[-1] and before <= saved <= after + 1, (before, after, saved)
    said = re.findall(r"SIGTERM: saved \S+last\.ckpt at step (\d+)", (run_dir / "train.log").read_text())
    assert said == [str(saved)]
    # Nothing of the group is left: the workers ended with the run.
    deadline = time.monotonic() + 5
    while (left := group_members(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


class WorkerState(torch.utils.data.Dataset):
    """What a DataLoader worker holds when it reads an item: whether it ignores each signal the run takes (SIGTERM,
    SIGINT, SIGUSR1, SIGUSR2), and its first draw."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple:
        handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)]
        return [h == signal.SIG_IGN for h in handlers], torch.rand(1).item()


def test_the_workers_ignore_stops_and_are_seeded_as_lightning_seeds_them():
    seed_everything(7, workers=True)  # as `train` does (PL_SEED_WORKERS=1; conftest's `process_state` resets it)

    def read(worker_init_fn) -> list:
        loader = DataLoader(WorkerState(), batch_size=None, num_workers=1, worker_init_fn=worker_init_fn,
                            generator=torch.Generator().manual_seed(3))  # fmt: skip
        return list(loader)

    ours = read(dataloader_worker_init)
    assert [ignored for ignored, _ in ours] == [[True, True, True, True]] * 2
    # Lightning's own (what it adds to a loader without a worker_init_fn, rank 0 on one device): the same draws.
    assert [draw for _, draw in ours] == [draw for _, draw in read(partial(pl_worker_init_function, rank=0))]
