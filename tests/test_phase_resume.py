"""A recipe's run (`task.phases`) killed in a later phase resumes there, on that phase's data, bit for bit: the
modern recipe's last phase trains its own batch (1 row of 8,192 tokens for 8 of 1,024), and each phase starts its
data's epochs at its own first step."""

import signal
from pathlib import Path

import pytest
import torch
from helpers.loss_recorder import recorded
from helpers.runs import TINY_MODERN_PRETRAIN, run_train_recorded, write_bert_corpus

pytestmark = pytest.mark.slow

# task=pretrain_modern on a tiny model: 32-token rows until the middle of the run, then 64-token ones.
MODERN = [
    *TINY_MODERN_PRETRAIN,
    "corpus=text",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=4",
    "task.checkpoint_every_n_steps=2",
    "+callbacks.record._target_=helpers.loss_recorder.RecordLosses",
]


def two_phases(batch_size: int) -> str:
    """Half the steps at 32 tokens (task.batch_size), then 64 tokens at `batch_size` rows a step."""
    return (
        "task.phases=[{until: 0.5, datamodule: {max_seq_length: 32}}, "
        f"{{until: 1.0, datamodule: {{max_seq_length: 64, batch_size: {batch_size}}}}}]"
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=10)


def killed_and_resumed(tmp_path: Path, args: list[str], kill_at: int, checkpoint_at: int) -> dict:
    """`args` run whole, then killed (SIGKILL) after step `kill_at` and rerun with resume=true in its directory: each
    run's losses by step (`RecordLosses`), and the resumed command's result."""
    whole = run_train_recorded(*args, f"+callbacks.record.path={tmp_path / 'whole.txt'}", f"hydra.run.dir={tmp_path}/w")
    assert whole.returncode == 0, whole.stderr[-3000:]
    crashed = tmp_path / "crashed"
    killed = run_train_recorded(
        *args,
        f"+callbacks.record.path={tmp_path / 'before.txt'}",
        "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep",
        f"+callbacks.kill.step={kill_at}",
        f"hydra.run.dir={crashed}",
        new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL
    assert torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == checkpoint_at
    resumed = run_train_recorded(
        *args, f"+callbacks.record.path={tmp_path / 'after.txt'}", f"hydra.run.dir={crashed}", "resume=true"
    )
    after = recorded(tmp_path / "after.txt") if (tmp_path / "after.txt").exists() else {}
    return {"result": resumed, "whole": recorded(tmp_path / "whole.txt"), "after": after, "log": crashed / "train.log"}


def test_a_run_killed_in_a_phase_with_its_own_batch_resumes_in_that_phase(tmp_path, corpus):
    """Phase 2 (steps 4-8) trains 2 rows a step, phase 1 trained 4: the checkpoint of step 6 is phase 2's, and its
    batch is the one that phase makes, not the run's first (refused before: "trained with 2 sequences per step
    ..., and this job makes 4")."""
    args = [*MODERN, f"corpus.paths=[{corpus}]", "trainer.max_steps=8", two_phases(batch_size=2)]
    run = killed_and_resumed(tmp_path, args, kill_at=7, checkpoint_at=6)
    assert run["result"].returncode == 0, run["result"].stderr[-3000:]
    assert "resumed from step 6" in run["log"].read_text()
    assert sorted(run["after"]) == [(step, 0) for step in range(7, 9)]
    for key, losses in run["after"].items():
        assert losses == run["whole"][key], key  # bit for bit


def test_a_run_killed_within_a_later_phase_resumes_bit_for_bit(tmp_path, corpus):
    """Phase 2 (steps 6-12) has 5 steps an epoch, and phase 1 stopped 6 batches into its epoch of 9: phase 2's data
    starts its epochs at step 6, in the run that goes on and in the one resumed from step 8 alike (before, the run
    that went on ended phase 2's first epoch after one batch, where its Lightning count of 6 passed the 5 of phase 2's
    epoch, while the resumed one counted its steps from step 6: steps 9-12 trained other data)."""
    args = [*MODERN, f"corpus.paths=[{corpus}]", "trainer.max_steps=12", two_phases(batch_size=4)]
    run = killed_and_resumed(tmp_path, args, kill_at=9, checkpoint_at=8)
    assert run["result"].returncode == 0, run["result"].stderr[-3000:]
    assert sorted(run["after"]) == [(step, 0) for step in range(9, 13)]
    for key, losses in run["after"].items():
        assert losses == run["whole"][key], key  # bit for bit
