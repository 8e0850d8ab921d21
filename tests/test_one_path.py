"""One path for a run: `lightbert.train(cfg)` from a script or a notebook does what `python src/train.py` does. Both
run the same config in real processes here, once to the end and once stopped by SIGTERM, and leave the same things:
the same files in the run directory, the same metrics, the same exit code and the same line."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import runtime
from helpers.runs import BASE, REPO, pythonpath_with_tests, run_train_recorded, write_bert_corpus

pytestmark = pytest.mark.slow

# The library verb as a notebook calls it: the config composed from conf/, then lightbert.train.
LIBRARY_RUN = """
import sys
import lightbert

cfg = lightbert.compose_config(sys.argv[2:], sys.argv[1])
results = lightbert.train(cfg)
print("best_score", results["best_score"])
"""


def run_library(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    script = [runtime.python(), "-c", textwrap.dedent(LIBRARY_RUN), str(run_dir), *overrides]
    env = {**os.environ, "PYTHONPATH": pythonpath_with_tests()}
    return subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)


def left_in(run_dir: Path) -> set[str]:
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()}


def metrics(run_dir: Path) -> dict:
    """The run's metrics but the clock's (examples and tokens per second, MFU)."""
    found = json.loads((run_dir / "results.json").read_text())["metrics"]
    return {name: value for name, value in found.items() if not name.endswith(("_per_s", "mfu"))}


@pytest.fixture
def overrides(tmp_path: Path) -> list[str]:
    corpus = write_bert_corpus(tmp_path / "corpus.txt")
    return [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=8", "task.checkpoint_every_n_steps=4"]


def test_the_library_verb_and_the_command_leave_the_same_run(tmp_path, overrides):
    command, library = tmp_path / "command", tmp_path / "library"
    by_command = run_train_recorded(*overrides, f"hydra.run.dir={command}")
    by_library = run_library(library, *overrides)
    assert by_command.returncode == 0, by_command.stderr[-2000:]
    assert by_library.returncode == 0, by_library.stderr[-2000:]
    assert left_in(command) == left_in(library)
    assert {"checkpoints/last.ckpt", "results.json", ".hydra/config.yaml", "metrics.csv"} <= left_in(library)
    assert metrics(command) == pytest.approx(metrics(library), rel=1e-5)
    assert "Traceback" not in by_library.stderr


def test_sigterm_stops_the_library_verb_as_it_stops_the_command(tmp_path, overrides):
    signal_at = ["+callbacks.term._target_=helpers.loss_recorder.SignalAtStep", "+callbacks.term.step=3"]
    command, library = tmp_path / "command", tmp_path / "library"
    by_command = run_train_recorded(*overrides, *signal_at, f"hydra.run.dir={command}")
    by_library = run_library(library, *overrides, *signal_at)
    for run_dir, result in ((command, by_command), (library, by_library)):
        assert result.returncode == 128 + 15, result.stderr[-2000:]
        assert f"lightbert: stopped by SIGTERM; the latest state is in {run_dir}/checkpoints/last.ckpt" in result.stderr
        assert (run_dir / "checkpoints" / "last.ckpt").is_file() and not (run_dir / "results.json").exists()
        assert "Traceback" not in result.stderr
    assert left_in(command) == left_in(library)
