"""A run directory is a self-contained record: moved or copied (a cluster's scratch to a laptop, a renamed sweep), it
is found by its own path. Its results.json and last.ckpt name files where the run was written; every command
(init_from, evaluate, predict, convert, resume) reads them under the directory given instead, never where the
original was: the original is renamed away while they run."""

from __future__ import annotations

import json
import logging
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.predictions import predict
from helpers.runs import compose_config, snapshot

from lightbert import evaluate, train
from lightbert.errors import UserError
from lightbert.interop.convert import to_hf


@contextmanager
def original_gone(run):
    """The original run directory renamed away while the test runs (it is the session's, shared): a command that
    opened any file of it by its recorded path fails."""
    hidden = run.dir.with_name(run.dir.name + "-renamed")
    run.dir.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(run.dir)


def copy_of(run, destination: Path) -> Path:
    shutil.copytree(run.dir, destination)
    return destination


def without_training(run) -> list[str]:
    return [o for o in run.overrides if not o.startswith(("init_from=", "trainer.max"))]


def test_a_copy_of_a_run_whose_original_was_renamed_starts_evaluates_and_predicts(sst2_run, tmp_path, caplog):
    copy = copy_of(sst2_run, tmp_path / "copy")
    best = Path(sst2_run.results["best_checkpoint"]).name
    caplog.set_level(logging.INFO, logger="lightbert.checkpoints.reading")
    with original_gone(sst2_run):
        overrides = [f"init_from={copy}", *without_training(sst2_run), "trainer.max_steps=2"]
        results = train(compose_config(overrides, tmp_path / "fine-tuned"))
        assert results["global_step"] == 2
        assert f"init_from={copy}: its best checkpoint, {copy / 'checkpoints' / best}" in caplog.text

        evaluation = [o for o in without_training(sst2_run) if not o.startswith("task.data_files.train")]
        scored = evaluate(compose_config([f"init_from={copy}", *evaluation], tmp_path / "eval", "evaluate"))
        assert scored["metrics"]["val/accuracy"] == pytest.approx(sst2_run.results["best_score"], abs=1e-6)

        predicted = predict(copy, [{"text": "a fine film"}, {"text": "a dull one"}], tmp_path)
        assert [p["label"] for p in predicted] and all(p["label"] in ("negative", "positive") for p in predicted)

        exported = to_hf(str(copy), str(tmp_path / "hf"))
        assert json.loads((exported / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}


def test_a_copy_without_its_tokenizer_is_refused_in_one_line_naming_the_file(sst2_run, tmp_path):
    """As its .ckpt alone: refused in one line naming tokenizer.json and task.datamodule.tokenizer_path, which a run
    copied without its tokenizer takes (tests/test_silent_round6.py runs it so)."""
    copy = copy_of(sst2_run, tmp_path / "copy")
    (copy / "tokenizer.json").unlink()
    out = tmp_path / "run"
    overrides = [f"init_from={copy}", *without_training(sst2_run), "trainer.max_steps=2"]
    with pytest.raises(UserError) as refused:
        train(compose_config(overrides, out))
    message = str(refused.value)
    assert "\n" not in message and f"init_from={copy} comes without its tokenizer (tokenizer.json" in message, message
    assert "task.datamodule.tokenizer_path=" in message
    assert not out.exists() or not any(out.iterdir())  # refused: nothing written


def test_a_moved_run_resumes_where_it_now_is_with_its_best_checkpoint_kept(sst2_run, tmp_path):
    # A run killed after its last save (no results.json yet), then moved: resume=true in its new place continues with
    # the best checkpoint and score last.ckpt recorded, read under the new directory.
    moved = copy_of(sst2_run, tmp_path / "moved")
    (moved / "results.json").unlink()
    before = snapshot(moved / "checkpoints")
    with original_gone(sst2_run):
        results = train(compose_config([*sst2_run.overrides, "resume=true"], moved))
    best = moved / "checkpoints" / Path(sst2_run.results["best_checkpoint"]).name
    assert results["best_checkpoint"] == str(best) and results["best_score"] == sst2_run.results["best_score"]
    assert snapshot(moved / "checkpoints")[best.name] == before[best.name]  # kept, not replaced by a worse one
    assert json.loads((moved / "results.json").read_text())["predictions"] == [str(moved / "predictions" / "SST-2.tsv")]
    assert (moved / "predictions" / "SST-2.tsv").read_text() == (sst2_run.dir / "predictions" / "SST-2.tsv").read_text()
