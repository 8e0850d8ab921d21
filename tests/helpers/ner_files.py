"""Small CoNLL-2003 files written by the tests: the shared task's text format (IOB1 or BIO) and the hub's columns."""

from __future__ import annotations

import random
from pathlib import Path

import datasets

from lightbert.tasks.ner.data import CONLL2003_LABELS

FILLER = "the of and to in was for on that by with as at from his her are were this which".split()
# Entities of each type: the words decide the type, so a model can learn it.
NAMES = {
    "PER": ["john smith", "mary", "peter brown jones", "anna"],
    "ORG": ["acme corp", "united nations", "reuters"],
    "LOC": ["paris", "new york", "germany"],
    "MISC": ["german", "olympic games"],
}


def ner_sentences(num_sentences: int, seed: int = 0, scheme: str = "bio") -> list[tuple[list[str], list[str]]]:
    """Random sentences of filler words and 1-3 entities; `scheme` "bio" (B- at every start) or "iob1" (I-, with
    B- only where an entity follows one of the same type)."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(num_sentences):
        words, tags = [], []
        for _ in range(rng.randint(1, 3)):
            for _ in range(rng.randint(0, 4)):
                words.append(rng.choice(FILLER))
                tags.append("O")
            kind = rng.choice(sorted(NAMES))
            name = rng.choice(NAMES[kind]).split()
            follows_same = bool(tags) and tags[-1] != "O" and tags[-1][2:] == kind
            first = "B" if scheme == "bio" or follows_same else "I"
            words += name
            tags += [f"{first}-{kind}"] + [f"I-{kind}"] * (len(name) - 1)
        words.append(".")
        tags.append("O")
        sentences.append((words, tags))
    return sentences


def write_conll_text(path: Path, sentences: list[tuple[list[str], list[str]]]) -> Path:
    """The shared task's format: word POS chunk tag, blank lines between sentences, -DOCSTART- per document."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words, tags in sentences:
        lines += [f"{w} NN I-NP {t}" for w, t in zip(words, tags, strict=True)] + [""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_hub_schema(path: Path, sentences: list[tuple[list[str], list[str]]]) -> Path:
    """The hub's columns (id, tokens, ner_tags as class indices) as json lines or parquet."""
    rows = {
        "id": [str(i) for i in range(len(sentences))],
        "tokens": [w for w, _ in sentences],
        "ner_tags": [[CONLL2003_LABELS.index(t) for t in tags] for _, tags in sentences],
    }
    dataset = datasets.Dataset.from_dict(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.to_parquet(str(path)) if path.suffix == ".parquet" else dataset.to_json(str(path), lines=True)
    return path


def ner_data_files(directory: Path, fmt: str = "conll", scheme: str = "bio", sizes=(120, 40, 40)) -> dict[str, Path]:
    """Train, validation and test files: CoNLL text (`fmt="conll"`) or the hub's columns (`"jsonl"`, `"parquet"`)."""
    files = {}
    for seed, (split, size) in enumerate(zip(("train", "validation", "test"), sizes, strict=True), start=1):
        sentences = ner_sentences(size, seed, scheme)
        if fmt == "conll":
            files[split] = write_conll_text(directory / f"{split}.txt", sentences)
        else:
            files[split] = write_hub_schema(directory / f"{split}.{fmt}", sentences)
    return files


NER_WORDS = FILLER + " ".join(n for names in NAMES.values() for n in names).split()


def read_conlleval(path):
    """Sentences of (word, gold, predicted) from a conlleval-format file."""
    sentences = [[]]
    for line in path.read_text().splitlines():
        if line:
            sentences[-1].append(line.split(" "))
        elif sentences[-1]:
            sentences.append([])
    return [s for s in sentences if s]
