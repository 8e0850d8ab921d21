"""GLUE (Wang et al. 2018) for fine-tuning: the nine tasks, their data, batches and submission files.

Data comes from the hub (`nyu-mll/glue`, the columns below) or from local files with the same columns,
given per split as `task.data_files.<split>=PATH` (csv, tsv, json, jsonl or parquet). Each input is
`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, truncated longest-first to `max_seq_length` like the reference
(`_truncate_seq_pair`). Tokenised once in `prepare_data` and cached under the cache directory; padded per batch.

Test predictions are written as the GLUE server expects: one TSV per test set (`index<TAB>prediction`),
named CoLA.tsv ... AX.tsv, with label names where the server wants names (MNLI, QNLI, RTE, AX).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping

import datasets
import torch

from lightbert.data.batches import PaddingCollator
from lightbert.data.encoding import encode_truncated
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule
from lightbert.tasks.finetuning.predictions import PredictionWriter
from lightbert.tasks.glue.metrics import GlueSubmission
from lightbert.tasks.glue.tasks import GlueTask, glue_task

HUB_DATASET = "nyu-mll/glue"


# -- tokenisation ------------------------------------------------------------------------------------------


def encode_examples(batch: dict, tokenizer: BertTokenizer, text_columns: tuple[str, ...], max_seq_length: int) -> dict:
    # Text is text: a cell that reads as a number is its digits, an empty one an empty sentence.
    texts = [tokenizer.encode_batch(["" if t is None else str(t) for t in batch[column]]) for column in text_columns]
    second = texts[1] if len(texts) == 2 else [None] * len(texts[0])
    encoded = [
        encode_truncated(a, b, max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
        for a, b in zip(texts[0], second, strict=True)
    ]
    pairs = list(zip(texts[0], second, strict=True))
    return {
        "input_ids": [ids for ids, _ in encoded],
        "token_type_ids": [types for _, types in encoded],
        # What a user must be told (counted by GlueDataModule.encode): a row cut, a text without a token.
        "cut": [len(a) + len(b or []) + (2 if b is None else 3) > max_seq_length for a, b in pairs],
        "empty": [not a or (b is not None and not b) for a, b in pairs],
    }


def _whole_number(text: str) -> bool:
    try:
        return float(text).is_integer()
    except ValueError:
        return False


def label_to_number(label: object, row: int, spec: GlueTask, where: str) -> dict:
    """A label as the model needs it: the class index (given as index or name), or the STS-B score. `row` (from 0)
    is named, 1-based, in the message of a bad cell."""
    if isinstance(label, str) and label.strip().lstrip("-").isdigit():
        label = int(label)  # a column with an empty cell is read as text
    if not spec.is_regression:
        if isinstance(label, str) and _whole_number(label):
            label = float(label)  # "1.0": a class index written by a tool that writes floats
        if isinstance(label, float) and label.is_integer():
            label = int(label)
        if isinstance(label, bool) and spec.num_labels == 2 and str(label) not in spec.label_names:
            label = int(label)  # True/False for a two-class task: 1/0
    if spec.is_regression:
        try:
            value = float(label)
        except (TypeError, ValueError):
            value = math.nan
        if not 0.0 <= value <= 5.0:  # NaN fails too
            raise UserError(f"{where}, row {row + 1}: label {label!r} is not a similarity score in [0, 5]")
        return {"label": value}
    if isinstance(label, str) and label in spec.label_names:
        return {"label": spec.label_names.index(label)}
    if label is None or label == "":
        raise UserError(f"{where}, row {row + 1}: the label cell is empty; every {spec.name} training row needs one")
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < spec.num_labels:
        raise UserError(
            f"{where}, row {row + 1}: label {label!r} is out of range; {spec.name} labels are "
            f"0..{spec.num_labels - 1} or the names {list(spec.label_names)}"
        )
    return {"label": label}


def _integer_idx(raw: datasets.Dataset, where: str) -> datasets.Dataset:
    """GLUE's `idx` names a row in the submission files: an integer (given as a number or as digits)."""
    values = raw["idx"]
    for row, value in enumerate(values, start=1):
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())
        ):
            raise UserError(
                f"{where}, row {row}: idx {value!r} is not a whole number; the idx column numbers the rows "
                "(0, 1, ...), or leave it out and the rows are numbered in order"
            )
    if all(isinstance(v, int) for v in values):
        return raw
    return raw.remove_columns("idx").add_column("idx", [int(v) for v in values])


# -- the DataModule ----------------------------------------------------------------------------------------


class GlueDataModule(FineTuningDataModule):
    """One GLUE task: its text columns and labels from `TASKS`, the rest from the fine-tuning base."""

    family = "glue"
    hub_dataset = HUB_DATASET

    @classmethod
    def token_types(cls, settings: Mapping) -> int:
        return len(glue_task(str(settings["task"])).text_columns)  # a sentence, or a pair

    def __init__(self, task: str, *, preprocessing_workers: int | None = None, **shared):
        self.spec = glue_task(task)
        self.name = self.spec.name
        self.validation_splits, self.test_splits = self.spec.validation_splits, self.spec.test_splits
        self.hub_config = self.spec.name
        self.preprocessing_workers = preprocessing_workers or min(8, os.cpu_count() or 1)
        super().__init__(**shared)

    @property
    def task_option(self) -> str:
        return f"glue/{self.name}"

    def hub_source(self, split: str) -> tuple[str | None, str]:
        return ("ax", "test") if split == "ax" else (self.spec.name, split)

    def required_columns(self, split: str) -> tuple[str, ...]:
        labelled = split in self.fit_splits
        return (*self.spec.text_columns, *(("label",) if labelled else ()))

    def check(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        """Labels in range; `idx` added (row number) where a file has none."""
        if "idx" not in raw.column_names:
            raw = raw.add_column("idx", list(range(len(raw))))
        else:
            raw = _integer_idx(raw, where)
        repeated = [idx for idx, n in Counter(raw["idx"]).items() if n > 1]
        if repeated:  # predictions are keyed by idx: a repeated one would lose rows
            raise UserError(f"{where}: the idx column must be unique; these repeat: {repeated[:5]}")
        if "label" not in raw.column_names:
            return raw.add_column("label", [-1] * len(raw))  # unlabelled test data, as on the hub
        if split in self.fit_splits:
            raw = raw.map(
                label_to_number,
                input_columns=["label"],
                with_indices=True,
                fn_kwargs={"spec": self.spec, "where": where},
            )
        return raw

    def encode(self, raw: datasets.Dataset, split: str, where: str) -> dict[str, datasets.Dataset]:
        workers = min(self.preprocessing_workers, len(raw) // 10_000)  # forking pays off on large splits only
        encoded = raw.map(
            encode_examples,
            batched=True,
            remove_columns=[c for c in raw.column_names if c not in ("label", "idx")],
            fn_kwargs={
                "tokenizer": self.tokenizer,
                "text_columns": self.spec.text_columns,
                "max_seq_length": self.max_seq_length,
            },
            num_proc=workers if workers > 1 else None,
            load_from_cache_file=False,  # cached as a whole by the base
            desc=f"Tokenizing {self.spec.name} {split}",
        )
        self.note(where, sum(encoded["cut"]), f"rows were cut to max_seq_length={self.max_seq_length} tokens")
        self.note(where, sum(encoded["empty"]), "rows have an empty text (no token): the model sees [CLS] [SEP]")
        return {split: encoded.remove_columns(["cut", "empty"])}

    def collator(self, train: bool) -> PaddingCollator:
        label_dtype = torch.float if self.spec.is_regression else torch.long
        fields = {"label": ("labels", label_dtype), "idx": ("idx", torch.long)}
        return PaddingCollator(self.tokenizer.pad_id, fields, self.pad_to_multiple_of)

    def prediction_writer(self) -> PredictionWriter:
        return GlueSubmission(self.spec)
