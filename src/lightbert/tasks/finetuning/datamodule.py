"""The fine-tuning DataModule: the skeleton GLUE, SQuAD, SWAG and CoNLL share, written once.

A task is a subclass that says what it is in class attributes (its name, hub dataset, splits, file formats) and
supplies hooks: `required_columns` and `check` (what a split must hold), `encode` (rows to token ids),
`collator` (rows to a batch), `cache_settings` (what else the cached encoding depends on) and, where it has
them, `read_file` (a format of its own), `hub_source`, `prediction_writer` and `evaluator`. This class does the
rest: local files or the hub, the checks every task makes, a cache of the encoded splits keyed by everything that
made them, and the loaders. `docs/adding-a-task.md` shows a whole task.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import datasets
import lightning as L
import torch
from torch.utils.data import DataLoader

from lightbert.data.batches import (
    check_num_workers,
    evaluation_batch_size,
    loader_workers,
    longest_first,
    make_loader,
)
from lightbert.data.encoding import MIN_SEQ_LENGTH, check_max_seq_length
from lightbert.data.local_files import (
    LOCAL_FORMATS,
    cache_writes,
    check_data_files,
    digest,
    file_identity,
    load_cached,
    progress_bars_for,
    read_hub,
    read_local,
    require_tokenizer,
    save_cache,
)
from lightbert.data.tokenizer import BertTokenizer, load_tokenizer
from lightbert.errors import ParameterError, UserError
from lightbert.tasks.finetuning.predictions import PredictionWriter

log = logging.getLogger(__name__)


class FineTuningDataModule(L.LightningDataModule):
    """Encodes every split once in `prepare_data` (cached under `cache_dir`); pads per batch."""

    # -- what a task is (class attributes; a subclass sets them) ---------------------------------------------------
    name: str = ""  # in messages, cache paths and `task=`; GLUE's nine tasks set it per instance
    family: ClassVar[str] = ""  # the cache's folder for the task's family: glue, squad, ner, swag
    hub_dataset: str = ""  # the Hugging Face dataset read without local files (task.datamodule.hub_dataset)
    hub_config: str | None = None
    validation_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[str, ...] = ()  # predicted after training where there is data for them
    predicts_validation: ClassVar[bool] = False  # write predictions for the validation splits too
    file_formats: ClassVar[tuple[str, ...] | None] = tuple(LOCAL_FORMATS)  # None: any file (read_file decides)
    cache_version: ClassVar[int] = 1  # bump when encoding changes, so cached splits are rebuilt
    min_seq_length: ClassVar[int] = MIN_SEQ_LENGTH
    length_column: ClassVar[str] = "input_ids"  # the token ids evaluation batches are sorted by (`longest_first`)

    @classmethod
    def token_types(cls, settings: Mapping) -> int:
        """How many segments (token type ids) the task's inputs use, from its datamodule settings: a model with a
        smaller `type_vocab_size` cannot embed them (checked before anything is written)."""
        return 2  # a pair: question and context, context and ending, ...

    def __init__(
        self,
        *,
        cache_dir: str,
        tokenizer: BertTokenizer | None = None,
        tokenizer_path: str | None = None,
        data_files: dict[str, str] | None = None,
        hub_dataset: str | None = None,
        max_seq_length: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int | str = "auto",
        pad_to_multiple_of: int | tuple[int, ...] | None = 8,
        fit: bool = True,
    ):
        super().__init__()
        self.fit = fit  # False: evaluation only (src/evaluate.py), which needs no training split
        require_tokenizer(tokenizer, tokenizer_path, self.task_option)
        check_max_seq_length(max_seq_length, self.min_seq_length)
        self._tokenizer, self.tokenizer_path = tokenizer, tokenizer_path
        self.cache_dir = Path(cache_dir).expanduser()
        self.data_files = {k: str(v) for k, v in (data_files or {}).items() if v}
        self.hub_dataset = hub_dataset or self.hub_dataset
        self.max_seq_length = max_seq_length
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size  # None: by the device
        check_num_workers(num_workers)
        self.num_workers, self.pad_to_multiple_of = num_workers, pad_to_multiple_of
        self._said_workers = False
        self.datasets: datasets.DatasetDict | None = None
        self._notes: list[str] = []
        self._said = False
        check_data_files(
            self.data_files,
            self.fit_splits,
            ("train", *self.validation_splits, *self.test_splits),
            self.name,
            self.file_formats,
        )

    @property
    def task_option(self) -> str:
        """The task= option that selects this task (GLUE's are glue/<name>)."""
        return self.name

    @cached_property
    def tokenizer(self) -> BertTokenizer:
        if self._tokenizer is not None:
            return self._tokenizer
        try:
            return load_tokenizer(self.tokenizer_path)
        except UserError as error:
            raise ParameterError.about("tokenizer_path", error) from None

    # -- splits ------------------------------------------------------------------------------------------------

    @property
    def fit_splits(self) -> tuple[str, ...]:
        """The labelled splits a run needs: train (unless it only evaluates) and the validation sets."""
        return ("train", *self.validation_splits) if self.fit else self.validation_splits

    @property
    def predict_splits(self) -> tuple[str, ...]:
        """What is predicted after training: the test sets there is data for (all from the hub, the given ones
        from local files), after the validation sets where the task predicts those too."""
        tests = tuple(s for s in self.test_splits if not self.data_files or s in self.data_files)
        return (*self.validation_splits, *tests) if self.predicts_validation else tests

    @property
    def splits(self) -> tuple[str, ...]:
        """Every split that is encoded: fit and predict splits."""
        return tuple(dict.fromkeys((*self.fit_splits, *self.predict_splits)))

    # -- hooks ---------------------------------------------------------------------------------------------------

    def required_columns(self, split: str) -> tuple[str, ...]:
        raise NotImplementedError

    def read_file(self, file: Path, where: str) -> datasets.Dataset:
        """One local file as rows (csv, tsv, json, jsonl, parquet by its suffix)."""
        return read_local(file, self.cache_dir, where)

    def hub_source(self, split: str) -> tuple[str | None, str]:
        """(config, split) of the hub dataset that holds `split`."""
        return self.hub_config, split

    def check(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        """The task's own checks of a split with its required columns and at least one row; may add columns."""
        return raw

    def cache_settings(self) -> list:
        """What the encoded splits depend on besides the data and the tokenizer (e.g. max_seq_length)."""
        return [self.max_seq_length]

    def encode(self, raw: datasets.Dataset, split: str, where: str) -> dict[str, datasets.Dataset]:
        """The split's rows as token ids: {split: encoded} (plus any other parts the task keeps)."""
        raise NotImplementedError

    def note(self, where: str, count: int, what: str) -> None:
        """Something the encoding did to the data that a user must know (rows cut, empty texts): said on the console
        at every run that uses this cache, counted, once."""
        if count:
            self._notes.append(f"{where}: {count} {what}")

    def on_encoded(self, cached_dir: Path) -> None:
        """Called once the encoded splits are in the cache (just made, or found): says the notes."""
        notes = cached_dir / "notes.json"
        for line in json.loads(notes.read_text()) if notes.is_file() else []:
            log.warning(line)

    def cache_notes(self) -> dict[str, str]:
        """Small text files saved with the encoded splits (called after `encode` has run on every split)."""
        return {"notes.json": json.dumps(self._notes, indent=1)}

    def collator(self, train: bool) -> Callable[[list[dict]], dict]:
        raise NotImplementedError

    def loader_columns(self, train: bool) -> list[str] | None:
        """The columns a batch is made from (None: all)."""
        return None

    def prediction_writer(self) -> PredictionWriter | None:
        """What writes `predict_splits`' predictions after training (None: nothing is predicted)."""
        return None

    def evaluator(self) -> Any | None:
        """What turns a task module's validation outputs into scores when that needs the data (SQuAD's answers)."""
        return None

    # -- sources -------------------------------------------------------------------------------------------------

    def load_split(self, split: str) -> tuple[datasets.Dataset, str]:
        """The split's rows, checked, and where they came from (for messages)."""
        if self.data_files:
            file = Path(self.data_files[split]).expanduser()
            where = f"task.data_files.{split} ({file})"
            raw = self.read_file(file, where)
        else:
            config, hub_split = self.hub_source(split)
            where = f"{self.hub_dataset}{'/' + config if config else ''} [{hub_split}]"
            raw = read_hub(self.hub_dataset, config, hub_split, self.fit_splits, where)
        required = list(self.required_columns(split))
        missing = [c for c in required if c not in raw.column_names]
        if missing:
            raise UserError(
                f"{where} lacks the column(s) {missing}; {self.name} needs {required}, the file has {raw.column_names}"
            )
        if len(raw) == 0:
            raise UserError(f"{where} has no rows")
        return self.check(raw, split, where), where

    # -- cache ---------------------------------------------------------------------------------------------------

    @cached_property
    def cached_dir(self) -> Path:
        """A digest of the settings, the tokenizer and each split's source (a file's identity, or the hub's name):
        the cache is rebuilt when any of them changes."""
        sources = {
            split: file_identity(Path(self.data_files[split]).expanduser())
            if self.data_files
            else [self.hub_dataset, *self.hub_source(split)]
            for split in self.splits
        }
        tokenizer = hashlib.sha256(self.tokenizer.backend.to_str().encode()).hexdigest()
        key = digest([self.cache_version, self.name, *self.cache_settings(), tokenizer, sources])
        return self.cache_dir / self.family / self.name / key

    def prepare_data(self) -> None:
        with cache_writes(self.cache_dir):  # a full disk, a read-only cache: one message
            self._prepare_data()

    def _prepare_data(self) -> None:
        if not (self.cached_dir / "dataset_dict.json").is_file():
            parts = {}
            for split in self.splits:
                raw, where = self.load_split(split)
                with progress_bars_for(len(raw)):
                    parts.update(self.encode(raw, split, where))
            save_cache(parts, self.cached_dir, self.cache_notes())
        if not self._said:  # Lightning calls prepare_data again for predict: the notes are said once
            self._said = True
            self.on_encoded(self.cached_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets is None:
            self.datasets = load_cached(self.cached_dir, self.prepare_data)

    # -- loaders -------------------------------------------------------------------------------------------------

    def loader(self, split: str, train: bool = False) -> DataLoader:
        assert self.datasets is not None, "call setup() first"
        dataset = self.datasets[split]
        columns = self.loader_columns(train)
        if columns is not None:
            dataset = dataset.select_columns(columns)
        batch_size = self.batch_size
        if not train:  # evaluation and prediction: similar lengths per batch, sized for the device
            dataset = longest_first(dataset, self.length_column)
            batch_size = evaluation_batch_size(self.eval_batch_size, self.batch_size, self.device())
        workers = self.workers(len(dataset) // batch_size)
        return make_loader(dataset, self.collator(train), batch_size, train, workers)

    def device(self) -> torch.device:
        """Where the model runs: the trainer's device (a CPU before there is a trainer)."""
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def workers(self, num_batches: int) -> int:
        """Loader processes for a split of `num_batches` (`loader_workers`); what "auto" chose is said once."""
        trainer = self.trainer
        device = self.device()
        workers = loader_workers(self.num_workers, device, num_batches, trainer.num_devices if trainer else 1)
        if self.num_workers == "auto" and workers and not self._said_workers:
            self._said_workers = True
            log.info(f"data loading: {workers} worker processes per device (task.datamodule.num_workers=auto on "
                     f"{device.type}; set a number to change it)")  # fmt: skip
        return workers

    def _loaders(self, splits: tuple[str, ...]) -> DataLoader | list[DataLoader]:
        loaders = [self.loader(split) for split in splits]
        return loaders[0] if len(loaders) == 1 else loaders

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", train=True)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._loaders(self.validation_splits)

    def predict_dataloader(self) -> DataLoader | list[DataLoader]:
        return self._loaders(self.predict_splits)
