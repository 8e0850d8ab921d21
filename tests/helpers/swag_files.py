"""Small SWAG files in the hub's columns (allenai/swag, config regular), written by the tests."""

from __future__ import annotations

import random
from pathlib import Path

import datasets

SUBJECTS = ["the man", "a woman", "the team", "someone", "the dog"]
# The right ending repeats the action of the context (sent1); the wrong ones are other actions: a model that
# relates sentence B to sentence A can learn it.
ACTIONS = ["runs to the river", "plays the music", "opens the house", "walks in the city", "watches the game"]


def swag_rows(num_rows: int, seed: int = 0) -> dict[str, list]:
    rng = random.Random(seed)
    rows: dict[str, list] = {k: [] for k in ("video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source")}
    rows.update({f"ending{i}": [] for i in range(4)})
    rows["label"] = []
    for n in range(num_rows):
        subject, action = rng.choice(SUBJECTS), rng.choice(ACTIONS)
        wrong = rng.sample([a for a in ACTIONS if a != action], 3)
        label = rng.randrange(4)
        endings = wrong[:label] + [action] + wrong[label:]
        rows["video-id"].append(f"video{n}")
        rows["fold-ind"].append(str(n))
        rows["sent1"].append(f"{subject.capitalize()} {action}.")
        rows["sent2"].append(subject.capitalize())
        rows["startphrase"].append(f"{rows['sent1'][-1]} {rows['sent2'][-1]}")
        rows["gold-source"].append("gold")
        for i, ending in enumerate(endings):
            rows[f"ending{i}"].append(f"{ending}.")
        rows["label"].append(label)
    return rows


def write_swag_file(path: Path, num_rows: int, seed: int = 0) -> Path:
    dataset = datasets.Dataset.from_dict(swag_rows(num_rows, seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":  # the format of the original distribution (train.csv, val.csv)
        dataset.to_csv(str(path), index=False)
    elif path.suffix == ".parquet":
        dataset.to_parquet(str(path))
    else:
        dataset.to_json(str(path), lines=True)
    return path


def swag_data_files(directory: Path, ext: str = "csv", sizes=(160, 40)) -> dict[str, Path]:
    return {
        split: write_swag_file(directory / f"swag_{split}.{ext}", size, seed)
        for seed, (split, size) in enumerate(zip(("train", "validation"), sizes, strict=True), start=1)
    }
