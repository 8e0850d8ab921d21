"""GLUE files as people write them: text is text, an index is unique, a bad cell is named by its row and value."""

from __future__ import annotations

import csv

import pytest

from lightbert.data.tokenizer import train_wordpiece
from lightbert.errors import UserError
from lightbert.tasks.glue.data import GlueDataModule

WORDS = ["na", "null", "none", "n/a", "nan", "the film was good", "the film was bad", "a river"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(WORDS * 20, vocab_size=80)


def write_csv(path, header, rows):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def datamodule(tmp_path, tokenizer, files, task="sst2"):
    return GlueDataModule(
        task, cache_dir=str(tmp_path / "cache"), tokenizer=tokenizer, data_files={k: str(v) for k, v in files.items()}
    )


def test_words_a_csv_reader_takes_for_missing_values_stay_words(tmp_path, tokenizer):
    sentences = ["NA", "null", "None", "n/a", "NaN", "the film was good"]
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], [(s, i % 2) for i, s in enumerate(sentences)])
    dm = datamodule(tmp_path, tokenizer, {"train": train, "validation": train})
    dm.prepare_data()
    dm.setup()
    lengths = [len(ids) for ids in dm.datasets["train"]["input_ids"]]
    assert min(lengths) > 2  # every sentence has a token between [CLS] and [SEP]
    first = tokenizer.convert_ids_to_tokens(dm.datasets["train"]["input_ids"][0][1:-1])
    assert first == ["na"]


def test_a_repeated_idx_in_a_test_file_is_an_error(tmp_path, tokenizer):
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], [("the film was good", 1)] * 4)
    test = write_csv(tmp_path / "test.csv", ["idx", "sentence"], [(i % 2, "a river") for i in range(20)])
    dm = datamodule(tmp_path, tokenizer, {"train": train, "validation": train, "test": test})
    with pytest.raises(UserError, match=r"test \(.*test.csv\): the idx column must be unique; these repeat: \[0, 1\]"):
        dm.prepare_data()


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("", r"row 3: the label cell is empty"),
        ("positive?", r"row 3: label 'positive\?' is out of range; sst2 labels are 0..1 or the names"),
        ("7", r"row 3: label 7 is out of range"),
    ],
)
def test_a_bad_label_cell_is_named_by_its_row_and_value(tmp_path, tokenizer, cell, message):
    rows = [("the film was good", 1), ("the film was bad", 0), ("a river", cell), ("na", 1)]
    train = write_csv(tmp_path / "train.csv", ["sentence", "label"], rows)
    dm = datamodule(tmp_path, tokenizer, {"train": train, "validation": train})
    with pytest.raises(UserError, match=message):
        dm.prepare_data()
