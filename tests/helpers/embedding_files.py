"""Small pair and triplet files in sentence-transformers' columns (anchor, positive, negative...), written by the
tests: no data is committed.

Each anchor names three topic words; its positive says the same with other words (each topic word's alias, shuffled,
with filler), its hard negative has the aliases of two of them and of another word. No anchor shares a word with its
positive, so an untrained model ranks positives near chance, and one that learns the aliases ranks them first. Every
anchor's words differ from every other anchor's (retrieval has one right answer), and the positives repeat no text
unless asked to (`duplicates`)."""

from __future__ import annotations

import csv
import itertools
import json
import random
from pathlib import Path

import datasets

TOPICS = (
    "river city music album house school people film game team war garden ocean market train bridge forest "
    "doctor library mountain island castle engine planet kitchen window letter camera desert"
).split()
ALIASES = (
    "stream town song record home college crowd movie match squad battle yard sea shop rail span woods physician "
    "archive peak isle fortress motor world galley pane note lens dunes"
).split()
ALIAS = dict(zip(TOPICS, ALIASES, strict=True))
FILLER = "the a of about with and some near".split()
WORDS = TOPICS + ALIASES + FILLER


def pair_rows(num_rows: int, seed: int = 0, negatives: int = 0, duplicates: int = 0) -> dict[str, list[str]]:
    """`num_rows` anchors with their positives (and `negatives` hard negatives each); the last `duplicates` rows
    repeat earlier rows' positives (a second anchor for the same text)."""
    rng = random.Random(seed)
    combos = list(itertools.combinations(TOPICS, 3))
    rng.shuffle(combos)
    columns: dict[str, list[str]] = {"anchor": [], "positive": []}
    for n in range(negatives):
        columns[f"negative_{n + 1}" if negatives > 1 else "negative"] = []
    for row in range(num_rows):
        words = list(combos[row])
        columns["anchor"].append(" ".join(words))
        if row >= num_rows - duplicates:
            columns["positive"].append(columns["positive"][row - (num_rows - duplicates)])
        else:
            body = [ALIAS[w] for w in words] + rng.sample(FILLER, 3)
            rng.shuffle(body)
            columns["positive"].append(" ".join(body))
        for n in range(negatives):
            swapped = words[:2] + [rng.choice([t for t in TOPICS if t not in words])]
            body = [ALIAS[w] for w in swapped] + rng.sample(FILLER, 3)
            rng.shuffle(body)
            columns[f"negative_{n + 1}" if negatives > 1 else "negative"].append(" ".join(body))
    return columns


def write_pairs(path: Path, columns: dict[str, list]) -> Path:
    """`path`'s extension picks the format: .jsonl, .json, .csv, .tsv or .parquet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    if path.suffix in (".csv", ".tsv"):
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writerow(columns)
            writer.writerows([list(r.values()) for r in rows])
    elif path.suffix == ".parquet":
        datasets.Dataset.from_dict(columns).to_parquet(str(path))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pair_files(directory: Path, train: int = 256, validation: int = 64, negatives: int = 0, suffix: str = ".jsonl"):
    """task.data_files for a train and a validation split (disjoint anchors)."""
    rows = pair_rows(train + validation, seed=1, negatives=negatives)
    train_rows = {k: v[:train] for k, v in rows.items()}
    validation_rows = {k: v[train:] for k, v in rows.items()}
    return {
        "train": str(write_pairs(directory / f"train{suffix}", train_rows)),
        "validation": str(write_pairs(directory / f"validation{suffix}", validation_rows)),
    }
