"""Small GLUE files in the hub's schema (nyu-mll/glue columns), written by the tests: no data is committed."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import datasets

from lightbert.tasks.glue.tasks import TASKS

WORDS = "the film was good bad great awful city river team game music album house war school people new old".split()


def glue_rows(task: str, num_rows: int, seed: int = 0, labelled: bool = True) -> dict[str, list]:
    """Random sentences; the label depends on the words (good/great -> 1), so a model can learn something."""
    spec = TASKS[task]
    rng = random.Random(seed)
    columns: dict[str, list] = {c: [] for c in spec.text_columns}
    labels = []
    for _ in range(num_rows):
        label = rng.randrange(spec.num_labels) if not spec.is_regression else round(rng.uniform(0, 5), 2)
        for column in spec.text_columns:
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
            if not spec.is_regression:
                words.insert(rng.randrange(len(words)), ["good", "great", "awful"][int(label) % 3])
            columns[column].append(" ".join(words).capitalize() + ".")
        labels.append(label if labelled else -1)
    return {**columns, "label": labels, "idx": list(range(num_rows))}


def write_glue_file(path: Path, task: str, num_rows: int = 24, seed: int = 0, labelled: bool = True) -> Path:
    """`path`'s extension picks the format: .csv, .tsv, .json, .jsonl or .parquet."""
    rows = glue_rows(task, num_rows, seed, labelled)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".tsv":
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
            writer.writerow(rows.keys())
            writer.writerows(zip(*rows.values(), strict=True))
        return path
    dataset = datasets.Dataset.from_dict(rows)
    if path.suffix == ".csv":
        dataset.to_csv(str(path), index=False)
    elif path.suffix in (".json", ".jsonl"):
        dataset.to_json(str(path), lines=True)
    elif path.suffix == ".parquet":
        dataset.to_parquet(str(path))
    else:
        raise ValueError(path)
    return path


def glue_data_files(directory: Path, task: str, ext: str = "csv", num_rows: int = 24) -> dict[str, Path]:
    """Train, validation and test files for `task`: what task.data_files.<split> points at."""
    spec = TASKS[task]
    files = {"train": write_glue_file(directory / f"{task}_train.{ext}", task, num_rows, seed=1)}
    for i, split in enumerate(spec.validation_splits):
        files[split] = write_glue_file(directory / f"{task}_{split}.{ext}", task, num_rows // 2, seed=2 + i)
    for i, split in enumerate(spec.test_splits):
        files[split] = write_glue_file(directory / f"{task}_{split}.{ext}", task, num_rows // 2, 10 + i, labelled=False)
    return files


def glue_overrides(task: str, files: dict, hf_dir) -> list[str]:
    return [
        f"task=glue/{task}",
        f"init_from={hf_dir}",
        "trainer=cpu",
        "logger=csv",
        "task.batch_size=8",
        "task.max_seq_length=32",
        "task.datamodule.num_workers=0",
        "trainer.max_epochs=2",
        *(f"task.data_files.{split}={path}" for split, path in files.items()),
    ]
