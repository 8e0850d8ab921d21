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
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader

from lightbert.data.batches import PaddingCollator
from lightbert.data.finetuning import FineTuningDataModule
from lightbert.data.local_files import check_data_files, progress_bars_for, read_hub, read_local, save_cache
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError

CACHE_VERSION = 1  # bump when tokenisation changes, so cached splits are rebuilt
HUB_DATASET = "nyu-mll/glue"


@dataclass(frozen=True)
class GlueTask:
    name: str
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...]  # () for regression
    metrics: tuple[str, ...]  # the leaderboard's; the task's score is their mean
    validation_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[str, ...] = ("test",)
    submission_files: tuple[str, ...] = ()  # one per test split
    submit_label_names: bool = False  # the server wants "entailment" rather than 0

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1  # one output: a regression score

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    def validation_tag(self, split: str) -> str:
        """Suffix of a validation set's metric names: '' for the only one, 'm'/'mm' for MNLI's two."""
        return {"validation_matched": "m", "validation_mismatched": "mm"}.get(split, "")


_NLI = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", ("sentence",), ("unacceptable", "acceptable"), ("mcc",), submission_files=("CoLA.tsv",)),
        GlueTask("sst2", ("sentence",), ("negative", "positive"), ("accuracy",), submission_files=("SST-2.tsv",)),
        GlueTask(
            "mrpc",
            ("sentence1", "sentence2"),
            ("not_equivalent", "equivalent"),
            ("f1", "accuracy"),
            submission_files=("MRPC.tsv",),
        ),
        GlueTask("stsb", ("sentence1", "sentence2"), (), ("pearson", "spearman"), submission_files=("STS-B.tsv",)),
        GlueTask(
            "qqp",
            ("question1", "question2"),
            ("not_duplicate", "duplicate"),
            ("f1", "accuracy"),
            submission_files=("QQP.tsv",),
        ),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            validation_splits=("validation_matched", "validation_mismatched"),
            # AX, the diagnostic set, has no training data: the MNLI model predicts it.
            test_splits=("test_matched", "test_mismatched", "ax"),
            submission_files=("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"),
            submit_label_names=True,
        ),
        GlueTask(
            "qnli",
            ("question", "sentence"),
            _NLI,
            ("accuracy",),
            submission_files=("QNLI.tsv",),
            submit_label_names=True,
        ),
        GlueTask(
            "rte",
            ("sentence1", "sentence2"),
            _NLI,
            ("accuracy",),
            submission_files=("RTE.tsv",),
            submit_label_names=True,
        ),
        GlueTask(
            "wnli",
            ("sentence1", "sentence2"),
            ("not_entailment", "entailment"),
            ("accuracy",),
            submission_files=("WNLI.tsv",),
        ),
    )
}


def glue_task(name: str) -> GlueTask:
    if name not in TASKS:
        raise UserError(f"unknown GLUE task {name!r}; valid: {sorted(TASKS)}")
    return TASKS[name]


# -- tokenisation ------------------------------------------------------------------------------------------


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Drop tokens from the end of the longer sequence until both fit (the reference's `_truncate_seq_pair`)."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()
    return a, b


def encode_examples(batch: dict, tokenizer: BertTokenizer, text_columns: tuple[str, ...], max_seq_length: int) -> dict:
    first = tokenizer.encode_batch([t or "" for t in batch[text_columns[0]]])
    if len(text_columns) == 1:
        pairs = [(a[: max_seq_length - 2], []) for a in first]
    else:
        second = tokenizer.encode_batch([t or "" for t in batch[text_columns[1]]])
        pairs = [truncate_pair(a, b, max_seq_length - 3) for a, b in zip(first, second, strict=True)]
    input_ids, token_type_ids = [], []
    for a, b in pairs:
        ids = [tokenizer.cls_id, *a, tokenizer.sep_id]
        types = [0] * len(ids)
        if len(text_columns) == 2:
            ids += [*b, tokenizer.sep_id]
            types += [1] * (len(b) + 1)
        input_ids.append(ids)
        token_type_ids.append(types)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids}


def label_to_number(label: object, spec: GlueTask, where: str) -> dict:
    """A label as the model needs it: the class index (given as index or name), or the STS-B score."""
    if spec.is_regression:
        try:
            value = float(label)
        except (TypeError, ValueError):
            value = math.nan
        if not 0.0 <= value <= 5.0:  # NaN fails too
            raise UserError(f"{where}: label {label!r} is not a similarity score in [0, 5]")
        return {"label": value}
    if isinstance(label, str) and label in spec.label_names:
        return {"label": spec.label_names.index(label)}
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < spec.num_labels:
        raise UserError(
            f"{where}: label {label!r} is out of range; {spec.name} labels are 0..{spec.num_labels - 1} "
            f"or the names {list(spec.label_names)}"
        )
    return {"label": label}


# -- the DataModule ----------------------------------------------------------------------------------------


class GlueDataModule(FineTuningDataModule):
    def __init__(
        self,
        task: str,
        cache_dir: str,
        tokenizer: BertTokenizer | None = None,
        tokenizer_path: str | None = None,
        data_files: dict[str, str] | None = None,
        hub_dataset: str = HUB_DATASET,
        max_seq_length: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        preprocessing_workers: int | None = None,
        pad_to_multiple_of: int | None = 8,
    ):
        self.spec = glue_task(task)
        if max_seq_length < 8:
            raise UserError(f"task.max_seq_length must be at least 8, got {max_seq_length}")
        super().__init__(
            f"glue/{task}",
            cache_dir,
            tokenizer,
            tokenizer_path,
            data_files,
            hub_dataset,
            batch_size,
            eval_batch_size,
            num_workers,
            pad_to_multiple_of,
        )
        self.max_seq_length = max_seq_length
        self.preprocessing_workers = preprocessing_workers or min(8, os.cpu_count() or 1)
        self._check_data_files()

    # -- sources ---------------------------------------------------------------------------------------------

    @property
    def fit_splits(self) -> tuple[str, ...]:
        return ("train", *self.spec.validation_splits)

    @property
    def predict_splits(self) -> tuple[str, ...]:
        """The test sets there is data for: all from the hub, the given ones from local files."""
        if not self.data_files:
            return self.spec.test_splits
        return tuple(s for s in self.spec.test_splits if s in self.data_files)

    def _check_data_files(self) -> None:
        known = (*self.fit_splits, *self.spec.test_splits)
        check_data_files(self.data_files, self.fit_splits, known, self.spec.name)

    def _load_raw(self, split: str) -> datasets.Dataset:
        if self.data_files:
            file = Path(self.data_files[split]).expanduser()
            where = f"task.data_files.{split} ({file})"
            raw = read_local(file, self.cache_dir, where)
        else:
            config, hub_split = ("ax", "test") if split == "ax" else (self.spec.name, split)
            where = f"{self.hub_dataset}/{config} [{hub_split}]"
            raw = read_hub(self.hub_dataset, config, hub_split, self.fit_splits, where)
        return self._checked(raw, split, where)

    def _checked(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        """Columns present, labels in range; `idx` added (row number) where a file has none."""
        is_test = split not in self.fit_splits
        required = [*self.spec.text_columns, *([] if is_test else ["label"])]
        missing = [c for c in required if c not in raw.column_names]
        if missing:
            raise UserError(
                f"{where} lacks the column(s) {missing}; {self.spec.name} needs {required}, "
                f"the file has {raw.column_names}"
            )
        if "idx" not in raw.column_names:
            raw = raw.add_column("idx", list(range(len(raw))))
        if "label" not in raw.column_names:
            raw = raw.add_column("label", [-1] * len(raw))  # unlabelled test data, as on the hub
        elif not is_test:
            raw = raw.map(label_to_number, input_columns=["label"], fn_kwargs={"spec": self.spec, "where": where})
        if len(raw) == 0:
            raise UserError(f"{where} has no rows")
        return raw

    # -- cache -----------------------------------------------------------------------------------------------

    @cached_property
    def cached_dir(self) -> Path:
        splits = (*self.fit_splits, *self.predict_splits)
        key = self.cache_key([CACHE_VERSION, self.spec.name, self.max_seq_length], splits, self.spec.name)
        return self.cache_dir / "glue" / self.spec.name / key

    def prepare_data(self) -> None:
        if (self.cached_dir / "dataset_dict.json").is_file():
            return
        encoded = {}
        for split in (*self.fit_splits, *self.predict_splits):
            raw = self._load_raw(split)
            with progress_bars_for(len(raw)):
                encoded[split] = raw.map(
                    encode_examples,
                    batched=True,
                    remove_columns=[c for c in raw.column_names if c not in ("label", "idx")],
                    fn_kwargs={
                        "tokenizer": self.tokenizer,
                        "text_columns": self.spec.text_columns,
                        "max_seq_length": self.max_seq_length,
                    },
                    num_proc=self._num_proc(len(raw)),
                    load_from_cache_file=False,  # cached as a whole below
                    desc=f"Tokenizing {self.spec.name} {split}",
                )
        save_cache(encoded, self.cached_dir)

    def _num_proc(self, num_rows: int) -> int | None:
        workers = min(self.preprocessing_workers, num_rows // 10_000)  # forking pays off on large splits only
        return workers if workers > 1 else None

    # -- loaders ---------------------------------------------------------------------------------------------

    def collator(self) -> PaddingCollator:
        label_dtype = torch.float if self.spec.is_regression else torch.long
        fields = {"label": ("labels", label_dtype), "idx": ("idx", torch.long)}
        return PaddingCollator(self.tokenizer.pad_id, fields, self.pad_to_multiple_of)

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        assert self.datasets is not None, "call setup() first"
        return self.loader(self.datasets[split], self.collator(), train)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> list[DataLoader]:
        return [self._loader(split) for split in self.spec.validation_splits]

    def predict_dataloader(self) -> list[DataLoader]:
        return [self._loader(split) for split in self.predict_splits]

    # -- submission ------------------------------------------------------------------------------------------

    def write_predictions(self, predictions: list[dict[int, float | int]], out_dir: Path) -> list[Path]:
        """One GLUE submission TSV per test split; `predictions[i]` maps idx -> prediction for test split i."""
        out_dir.mkdir(parents=True, exist_ok=True)
        files = dict(zip(self.spec.test_splits, self.spec.submission_files, strict=True))
        written = []
        for split, by_idx in zip(self.predict_splits, predictions, strict=True):
            path = out_dir / files[split]
            tmp = path.with_suffix(".tmp")
            with tmp.open("w", encoding="utf-8") as f:
                f.write("index\tprediction\n")
                for idx in sorted(by_idx):
                    f.write(f"{idx}\t{self._submission_label(by_idx[idx])}\n")
            tmp.replace(path)
            written.append(path)
        return written

    def _submission_label(self, prediction: float | int) -> str:
        if self.spec.is_regression:
            return f"{min(5.0, max(0.0, float(prediction))):.3f}"  # the server's STS-B range
        if self.spec.submit_label_names:
            return self.spec.label_names[int(prediction)]
        return str(int(prediction))
