"""Small SQuAD files written by the tests: the official nested JSON and the hub's flat columns. No data is committed.

Each paragraph is random words with a few "facts" ("the river of tokyo is blue."); a question asks for one fact's
value, so its answer occurs in the context at a known character offset. v2.0 files add unanswerable questions
about facts the paragraph does not hold.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import datasets

FILLER = "the film was good bad great awful city river team game music album house war school people new old".split()
THINGS = ["river", "house", "team", "album", "school"]
PLACES = ["tokyo", "paris", "lima", "oslo", "cairo", "delhi"]
VALUES = ["blue", "green", "old", "new", "great", "awful"]


def squad_articles(
    num_paragraphs: int, seed: int = 0, unanswerable: bool = False, filler: int = 30, num_facts: int = 3
) -> list[dict]:
    rng = random.Random(seed)
    paragraphs = []
    for p in range(num_paragraphs):
        facts = rng.sample([(t, c) for t in THINGS for c in PLACES], num_facts)
        context, qas = "", []
        for n, (thing, place) in enumerate(facts):
            context += " ".join(rng.choice(FILLER) for _ in range(rng.randint(filler // 2, filler))) + ". "
            value = rng.choice(VALUES)
            sentence = f"The {thing} of {place.capitalize()} is {value}. "
            start = len(context) + sentence.index(value)
            context += sentence
            qas.append(
                {
                    "id": f"q{seed}-{p}-{n}",
                    "question": f"What is the {thing} of {place}?",
                    "answers": [{"text": value, "answer_start": start}],
                }
            )
        if unanswerable:
            thing, place = next((t, c) for t in THINGS for c in PLACES if (t, c) not in facts)
            qas.append(
                {
                    "id": f"q{seed}-{p}-none",
                    "question": f"What is the {thing} of {place}?",
                    "answers": [],
                    "is_impossible": True,
                    "plausible_answers": [{"text": qas[0]["answers"][0]["text"], "answer_start": 0}],
                }
            )
        paragraphs.append({"context": context.strip(), "qas": qas})
    return [{"title": f"article {seed}", "paragraphs": paragraphs}]


def write_official(path: Path, articles: list[dict], version: str = "1.1") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": version, "data": articles}), encoding="utf-8")
    return path


def write_flat(path: Path, articles: list[dict]) -> Path:
    """The hub's columns (rajpurkar/squad): .jsonl or .parquet by the extension."""
    rows = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                rows["id"].append(qa["id"])
                rows["title"].append(article["title"])
                rows["context"].append(paragraph["context"])
                rows["question"].append(qa["question"])
                rows["answers"].append(
                    {
                        "text": [a["text"] for a in qa["answers"]],
                        "answer_start": [a["answer_start"] for a in qa["answers"]],
                    }
                )
    dataset = datasets.Dataset.from_dict(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        dataset.to_parquet(str(path))
    else:
        dataset.to_json(str(path), lines=True)
    return path


def squad_data_files(directory: Path, version: str = "1.1", num_paragraphs: int = 8, fmt: str = "official") -> dict:
    unanswerable = version == "2.0"
    train = squad_articles(num_paragraphs, seed=1, unanswerable=unanswerable)
    dev = squad_articles(max(2, num_paragraphs // 2), seed=2, unanswerable=unanswerable)
    if fmt == "official":
        return {
            "train": write_official(directory / "train.json", train, version),
            "validation": write_official(directory / "dev.json", dev, version),
        }
    return {
        "train": write_flat(directory / f"train.{fmt}", train),
        "validation": write_flat(directory / f"dev.{fmt}", dev),
    }
