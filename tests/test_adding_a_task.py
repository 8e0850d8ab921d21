"""The diff in docs/adding-a-task.md is complete: applied to a copy of the repository, the new task fine-tunes."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shutil
import subprocess

from helpers import runtime
from helpers.models import write_hf_bert
from helpers.runs import REPO


def docs_diff() -> str:
    page = (REPO / "docs" / "adding-a-task.md").read_text(encoding="utf-8")
    (diff,) = re.findall(r"```diff\n(.*?)```", page, re.DOTALL)  # the page shows one diff: this one
    return diff


def write_boolq_file(path, num_rows: int, seed: int) -> None:
    rng = random.Random(seed)
    words = "the river city team music film war school game house".split()
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "passage", "label"])
        for _ in range(num_rows):
            label = rng.randrange(2)
            question = " ".join(rng.choices(words, k=5)) + ("yes" if label else "no") + "?"
            writer.writerow([question, " ".join(rng.choices(words, k=20)) + ".", label])


def test_the_docs_diff_adds_a_glue_style_task(tmp_path):
    diff = docs_diff()
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(diff.splitlines()) < 60 and len(added) >= 10  # the whole change, and a real one

    copy = tmp_path / "repo"
    for part in ("src", "conf"):
        shutil.copytree(
            REPO / part, copy / part, symlinks=True, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
        )
    applied = subprocess.run(["git", "apply", "-"], input=diff, text=True, cwd=copy, capture_output=True)
    assert applied.returncode == 0, applied.stderr

    data = {split: tmp_path / f"{split}.csv" for split in ("train", "validation")}
    for seed, path in enumerate(data.values()):
        write_boolq_file(path, 16, seed)
    run = subprocess.run(
        [runtime.python(), str(copy / "src" / "train.py"), "task=glue/boolq"]
        + [f"init_from={write_hf_bert(tmp_path / 'bert')}", "logger=csv", "trainer.max_epochs=1", "task.batch_size=8"]
        + [f"task.data_files.{split}={path}" for split, path in data.items()]
        + [f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(copy / "src")},  # the copy's lightbert, with the diff
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["monitor"] == "val/score" and 0.0 <= results["metrics"]["val/accuracy"] <= 1.0
