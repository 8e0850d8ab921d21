"""`src/evaluate.py`: a fine-tuned checkpoint scored on a task's dev split without training, with the metrics and the
prediction files of its run, into a new run directory; the checkpoint's own is left as it was."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import runtime
from helpers.runs import REPO, snapshot

from lightbert import evaluate
from lightbert.errors import UserError
from lightbert.run.configs import compose_config


def evaluate_config(overrides: list[str], output_dir: Path):
    """The config `python src/evaluate.py OVERRIDES` runs, with its run directory at `output_dir`."""
    return compose_config(overrides, output_dir, config_name="evaluate")


def evaluate_run(run, tmp_path: Path, *extra: str) -> dict:
    # Everything the run was given but its training data: evaluation needs none.
    overrides = [o for o in run.overrides if not o.startswith(("init_from=", "trainer.max", "task.data_files.train"))]
    return evaluate(evaluate_config([f"init_from={run.dir}", *overrides, *extra], tmp_path / "eval"))


def test_squad_evaluation_equals_the_runs_best_dev_scores_and_files(squad_v2_run, tmp_path):
    before = snapshot(squad_v2_run.dir)
    results = evaluate_run(squad_v2_run, tmp_path)
    assert results["metrics"]["val/f1"] == pytest.approx(squad_v2_run.results["best_score"], abs=1e-6)
    for name in ("predictions.json", "null_odds.json", "eval.json"):
        ours = json.loads((tmp_path / "eval" / "predictions" / name).read_text())
        theirs = json.loads((squad_v2_run.dir / "predictions" / name).read_text())
        assert ours == pytest.approx(theirs) if name != "predictions.json" else ours == theirs
    assert snapshot(squad_v2_run.dir) == before  # the checkpoint's run directory is untouched
    record = tmp_path / "eval"
    assert {"results.json", "metrics.csv", ".hydra/config.yaml"} <= set(snapshot(record))
    assert json.loads((record / "results.json").read_text())["evaluated"].startswith(str(squad_v2_run.dir))


def test_ner_evaluation_writes_the_runs_conlleval_files(ner_run, tmp_path):
    results = evaluate_run(ner_run, tmp_path)
    assert results["metrics"]["val/f1"] == pytest.approx(ner_run.results["best_score"], abs=1e-6)
    for split in ("validation.txt", "test.txt"):
        ours = (tmp_path / "eval" / "predictions" / split).read_text()
        assert ours == (ner_run.dir / "predictions" / split).read_text()


def test_glue_evaluation_scores_dev_and_writes_the_submission_file(sst2_run, tmp_path):
    results = evaluate_run(sst2_run, tmp_path)
    assert results["metrics"]["val/accuracy"] == pytest.approx(sst2_run.results["best_score"], abs=1e-6)
    submitted = tmp_path / "eval" / "predictions" / "SST-2.tsv"
    assert submitted.read_text() == (sst2_run.dir / "predictions" / "SST-2.tsv").read_text()


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ("squad_v2", "is a sequence classification model, and task=squad_v2 evaluates a question answering head"),
        ("glue/mnli", r"with the labels \['negative', 'positive'\], and task=glue/mnli evaluates the labels \['entail"),
        ("conll2003", "evaluates a token classification head"),
    ],
)
def test_a_checkpoint_of_another_head_is_refused_before_anything_is_written(sst2_run, task, message, tmp_path):
    out = tmp_path / "eval"
    with pytest.raises(UserError, match=message):
        evaluate(evaluate_config([f"task={task}", f"init_from={sst2_run.dir}", "logger=csv"], out))
    assert not out.exists() or not any(out.iterdir())


def test_a_pre_trained_model_without_a_head_is_refused(sst2_run, tmp_path):
    out = tmp_path / "eval"
    with pytest.raises(UserError, match="a pre-trained model without a fine-tuned head"):
        evaluate(evaluate_config(["task=glue/sst2", f"init_from={sst2_run.dir.parent / 'bert'}"], out))
    assert not out.exists() or not any(out.iterdir())


def test_the_command_needs_init_from_and_runs_under_evals(sst2_run, tmp_path):
    run = subprocess.run(
        [runtime.python(), str(REPO / "src" / "evaluate.py"), "task=glue/sst2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 2 and "set init_from=" in run.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # refused: nothing written
    files = [o for o in sst2_run.overrides if o.startswith(("task.data_files.validation", "task.data_files.test"))]
    run = subprocess.run(
        [
            runtime.python(),
            str(REPO / "src" / "evaluate.py"),
            "task=glue/sst2",
            "logger=csv",
            f"init_from={sst2_run.dir}",
            *files,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    (record,) = [d for d in (tmp_path / "outputs" / "sst2" / "evals").iterdir() if any(d.iterdir())]
    assert f"Outputs in {record}" in run.stdout and (record / "results.json").is_file()
