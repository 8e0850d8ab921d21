"""Faults around the disk, with real processes: a full disk while saving keeps the last good
checkpoint and leaves no temporary file, a killed save's temporary file is cleaned up by the next run, a
`checkpoints` that cannot hold checkpoints is found before training, and feature extraction leaves nothing half."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import pytest
from helpers.models import extract_config
from helpers.runs import BASE, run_train_recorded, write_bert_corpus

from lightbert.errors import UserError
from lightbert.inference.embeddings import extract_to_file

pytestmark = pytest.mark.slow

ARGS = [*BASE, "trainer.max_steps=10"]  # a checkpoint every 4 steps


def temporaries(run_dir: Path) -> list[Path]:
    return [p for d in (run_dir, run_dir / "checkpoints") if d.is_dir() for p in d.glob(".*.tmp-*")]


@pytest.fixture
def killed_run(tmp_path) -> tuple[Path, list[str]]:
    """A run killed after step 6; its last.ckpt is step 4's."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10)
    run_dir = tmp_path / "run"
    args = [*ARGS, f"corpus.paths=[{corpus}]", f"hydra.run.dir={run_dir}"]
    killed = run_train_recorded(
        *args, "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=6", new_session=True
    )
    assert killed.returncode == -signal.SIGKILL
    return run_dir, args


def test_a_full_disk_while_saving_keeps_the_last_checkpoint_and_no_temporary_file(killed_run):
    run_dir, args = killed_run
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    # step 8's checkpoint does not fit
    full = run_train_recorded(*args, "resume=true", file_size_limit=len(before) // 2)
    assert full.returncode == 2, full.stderr[-3000:]
    errors = [line for line in full.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert len(errors) == 1 and "could not write the checkpoint" in errors[0] and "is kept whole" in errors[0]
    assert "Traceback" not in full.stderr
    assert last.read_bytes() == before and temporaries(run_dir) == []
    resumed = run_train_recorded(*args, "resume=true")  # room again: the run goes on from step 4
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def test_a_kill_during_a_save_keeps_the_last_checkpoint_and_the_next_run_removes_the_half_file(killed_run):
    run_dir, args = killed_run
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()  # step 4's
    killed = run_train_recorded(*args, "resume=true", "+callbacks.kill._target_=helpers.loss_recorder.KillDuringSave",
                   "+callbacks.kill.step=5", new_session=True)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert last.read_bytes() == before  # the save of step 8 never replaced it
    (left,) = temporaries(run_dir)  # what the kill left: step 8's checkpoint, never renamed into place
    assert left.stat().st_size > 0
    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "removed 1 temporary file(s)" in resumed.stdout + resumed.stderr and "that a killed save left" in (
        resumed.stdout + resumed.stderr
    )
    assert temporaries(run_dir) == []


def test_a_checkpoints_that_cannot_hold_checkpoints_is_found_before_training(tmp_path):
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a directory")
    refused = run_train_recorded(*ARGS, f"corpus.paths=[{corpus}]", f"hydra.run.dir={run_dir}")
    assert refused.returncode == 2 and "checkpoints is a file, not a directory" in refused.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]  # nothing else written


def test_feature_extraction_leaves_no_temporary_file_after_an_error(tmp_path, bert4):
    cfg = extract_config(bert4, tmp_path, [-5])
    with pytest.raises(UserError, match="from -4 to 3"):
        extract_to_file(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_damaged_cache_is_rebuilt_and_said(tmp_path, caplog, monkeypatch):
    """The cached examples' examples.json, one of their .arrow files and the cached tokenizer cut short (a disk
    that filled, a copy interrupted): the next run rebuilds each, says so, and trains."""
    from helpers.runs import TINY_PRETRAIN, compose_config

    from lightbert import train

    monkeypatch.setenv("LIGHTBERT_CACHE", str(tmp_path / "cache"))
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=10, seed=21)
    overrides = [*TINY_PRETRAIN, f"corpus.paths=[{corpus}]", "trainer.max_steps=1"]
    assert train(compose_config(overrides, tmp_path / "first"))["global_step"] == 1
    caplog.set_level("WARNING")
    (index,) = (tmp_path / "cache" / "examples").glob("*/examples.json")
    index.write_text('{"documents": ["doc')
    assert train(compose_config(overrides, tmp_path / "second"))["global_step"] == 1
    assert f"the cache entry {index.parent} could not be read" in caplog.text and "it is rebuilt" in caplog.text
    arrow = max((tmp_path / "cache" / "examples").glob("*/*.arrow"), key=lambda p: p.stat().st_size)
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    caplog.clear()
    assert train(compose_config(overrides, tmp_path / "second_arrow"))["global_step"] == 1
    assert f"the cache entry {index.parent} could not be read" in caplog.text and "it is rebuilt" in caplog.text
    (tokenizer,) = (tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json.gz")
    tokenizer.write_bytes(tokenizer.read_bytes()[:100])
    assert train(compose_config(overrides, tmp_path / "third"))["global_step"] == 1
    assert f"the cached tokenizer {tokenizer} could not be read" in caplog.text and "trained again" in caplog.text


def test_a_cache_that_cannot_be_written_is_one_message(tmp_path):
    import datasets

    from lightbert.data.local_files import save_cache

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), not the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
    try:
        with pytest.raises(UserError, match="could not write the cache .*File too large. Free space there"):
            save_cache({"train": datasets.Dataset.from_dict({"text": ["x" * 100] * 1000})}, tmp_path / "cache" / "k")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, previous)
    assert not any((tmp_path / "cache").iterdir())  # nothing half-written left for a later run to read
