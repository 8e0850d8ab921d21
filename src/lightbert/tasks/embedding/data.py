"""Pairs and triplets for contrastive fine-tuning (`task=embedding`), in sentence-transformers' column convention.

A split is a table with an `anchor` column (the query), a `positive` column (the text that answers it) and, optionally,
hard negatives (`negative`, or `negative_1`, `negative_2`, ...: texts that look relevant and are not). Columns under
other names are mapped with `task.columns.anchor=...`, `task.columns.positive=...` and `task.columns.negatives=[...]`.
Local files (`task.data_files.train/validation`; csv, tsv, json, jsonl, parquet) or a hub dataset with those columns
(`task.datamodule.hub_dataset`, `hub_config`).

Each text is encoded on its own, `[CLS] text [SEP]`, cut to `max_seq_length` as sentence-transformers' tokenizer cuts
it. A batch holds every text of its rows in one (N, T) tensor (anchors, then positives, then each row's negatives),
embedded in one forward pass; the layers skip the padding (`speed.unpad`), so one tensor for all costs no more than
one per column.

Training batches hold no text twice (sentence-transformers' NoDuplicatesBatchSampler): a second row with the same
positive, or a row whose anchor is another's positive, would be a negative that is in fact right (a false negative).
The global batch (task.batch_size on each device, every device's rows its candidates) is what is kept free of them.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightbert.cluster.processes import dataloader_worker_init
from lightbert.data.batches import pad_batch
from lightbert.data.encoding import encode_truncated
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import ParameterError, UserError
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule

log = logging.getLogger(__name__)

DEFAULT_COLUMNS = {"anchor": "anchor", "positive": "positive", "negatives": None}


def text_key(text: str) -> int:
    """A text's identity in a batch: a stable 63-bit digest (Python's `hash` differs between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def negative_columns(column_names: Sequence[str]) -> list[str]:
    """The hard-negative columns of a table in sentence-transformers' convention: `negative`, `negative_<n>` or
    `negative<n>`, in the table's order."""
    return [c for c in column_names if c == "negative" or (c.startswith("negative") and c[8:].lstrip("_").isdigit())]


def encode_texts(texts: list[str], tokenizer: BertTokenizer, max_seq_length: int) -> tuple[list[list[int]], list[bool]]:
    """Each text as `[CLS] text [SEP]`, cut to `max_seq_length`; and whether each was cut."""
    encoded = tokenizer.encode_batch(texts)
    ids = [encode_truncated(e, None, max_seq_length, tokenizer.cls_id, tokenizer.sep_id)[0] for e in encoded]
    return ids, [len(e) > max_seq_length - 2 for e in encoded]


def encode_rows(batch: dict, columns: dict, tokenizer: BertTokenizer, max_seq_length: int) -> dict:
    """Each row's texts as token ids (its negatives a list, in the columns' order), their keys (`text_key`), and how
    many of its texts were cut."""
    names = [columns["anchor"], columns["positive"], *columns["negatives"]]
    encoded = [encode_texts(batch[name], tokenizer, max_seq_length) for name in names]
    rows = len(batch[names[0]])
    return {
        "anchor_ids": encoded[0][0],
        "positive_ids": encoded[1][0],
        "negative_ids": [[ids[row] for ids, _ in encoded[2:]] for row in range(rows)],
        "text_keys": [[text_key(batch[name][row]) for name in names] for row in range(rows)],
        "cut": [sum(cut[row] for _, cut in encoded) for row in range(rows)],
    }


class EmbeddingCollator:
    """Rows -> one padded (N, T) batch of every text: the rows' anchors (B), their positives (B), then their hard
    negatives (B x k, row by row); `rows` is B. Validation batches carry the corpus `document` of each row's
    positive."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int | tuple[int, ...] | None = 8):
        self.pad_id, self.pad_to_multiple_of = pad_id, pad_to_multiple_of

    def __call__(self, rows: list[dict]) -> dict:
        texts = [r["anchor_ids"] for r in rows] + [r["positive_ids"] for r in rows]
        texts += [negative for r in rows for negative in r["negative_ids"]]
        batch = pad_batch([{"input_ids": t, "token_type_ids": [0] * len(t)} for t in texts], self.pad_id,
                          self.pad_to_multiple_of)  # fmt: skip
        batch["rows"] = len(rows)
        if "document" in rows[0]:
            batch["document"] = torch.tensor([r["document"] for r in rows], dtype=torch.long)
        return batch


class NoDuplicatesSampler(DistributedSampler):
    """The training order of an epoch, in global batches of `batch_size` x devices rows that share no text; each
    device takes its `batch_size` rows of each global batch. The order is a shuffle of (seed, epoch), the same on
    every device; rows that clash with a batch wait for a later one, and the rows left when no full global batch can
    be made of them wait for the next epoch (a batch of a few rows would be a weaker loss, and the devices would
    differ in steps). Its length is the epoch's real number of batches (its batches are drawn once per epoch), so
    Lightning's schedule counts the steps that run. Subclassing `DistributedSampler` keeps Lightning from wrapping it
    in one of its own."""

    def __init__(self, keys: list[list[int]], batch_size: int, num_replicas: int, rank: int, seed: int):
        super().__init__(range(len(keys)), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.keys, self.batch_size = keys, batch_size
        self.global_batch = batch_size * num_replicas
        self._drawn: tuple[int, list[list[int]]] | None = None  # (epoch, its global batches)

    def global_batches(self) -> list[list[int]]:
        """This epoch's global batches, drawn once per epoch."""
        if self._drawn is None or self._drawn[0] != self.epoch:
            self._drawn = (self.epoch, self._draw())
        return self._drawn[1]

    def _draw(self) -> list[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.keys)).tolist()
        remaining = dict.fromkeys(order)  # in order; taken rows are deleted
        batches = []
        while len(remaining) >= self.global_batch:
            batch, seen = [], set()
            for index in remaining:
                texts = self.keys[index]
                if seen.isdisjoint(texts):
                    batch.append(index)
                    seen.update(texts)
                    if len(batch) == self.global_batch:
                        break
            if len(batch) < self.global_batch:  # what remains cannot fill a batch without a clash
                break
            for index in batch:
                del remaining[index]
            batches.append(batch)
        return batches

    def __iter__(self) -> Iterator[int]:
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        return iter([index for batch in self.global_batches() for index in batch[mine]])

    def __len__(self) -> int:
        return len(self.global_batches()) * self.batch_size


class EmbeddingDataModule(FineTuningDataModule):
    """Pairs or triplets for `task=embedding`."""

    name = family = "embedding"
    cache_version = 1
    length_column = "positive_ids"  # evaluation batches by their positives' lengths, the longer texts as a rule

    @classmethod
    def token_types(cls, settings: Mapping) -> int:
        return 1  # single texts: a model without segment embeddings (ModernBERT) embeds them too

    def __init__(
        self,
        *,
        columns: Mapping | None = None,
        hub_config: str | None = None,
        hub_splits: Mapping[str, str] | None = None,
        **kwargs,
    ):
        self.columns = {**DEFAULT_COLUMNS, **dict(columns or {})}
        for role in ("anchor", "positive"):
            if not isinstance(self.columns[role], str) or not self.columns[role]:
                raise ParameterError(f"{{0}}.{role} must name a column, got {self.columns[role]!r}", "columns")
        negatives = self.columns["negatives"]
        if negatives is not None and (isinstance(negatives, str) or not all(isinstance(n, str) for n in negatives)):
            raise ParameterError(f"{{0}}.negatives must be a list of column names or null, got {negatives!r}",
                                 "columns")  # fmt: skip
        self.hub_config = hub_config
        self.hub_splits = {"train": "train", "validation": "validation", **dict(hub_splits or {})}
        super().__init__(**kwargs)
        if self.batch_size < 2:
            raise ParameterError(
                f"{{0}}={self.batch_size}: a batch of one pair has no in-batch negatives, so the contrastive loss "
                "learns nothing from it; use 2 or more (32 or more works best)",
                "batch_size",
            )
        if not self.data_files and not self.hub_dataset:
            raise UserError(
                "task=embedding needs its pairs: task.data_files.train=PATH task.data_files.validation=PATH (jsonl, "
                "csv, tsv, json or parquet with anchor and positive columns), or a hub dataset with those columns, "
                "task.datamodule.hub_dataset=NAME"
            )
        self._negatives: dict[str, list[str]] = {}  # each split's hard-negative columns (the train split's only)

    # -- columns -------------------------------------------------------------------------------------------------

    def required_columns(self, split: str) -> tuple[str, ...]:
        negatives = (self.columns["negatives"] or ()) if split == "train" else ()
        return (self.columns["anchor"], self.columns["positive"], *negatives)

    def check(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        # Hard negatives train; validation scores anchors against the split's positives, and its loss is in-batch.
        negatives = self.columns["negatives"]
        if negatives is None:
            negatives = negative_columns(raw.column_names) if split == "train" else []
        self._negatives[split] = list(negatives) if split == "train" else []
        used = [self.columns["anchor"], self.columns["positive"], *self._negatives[split]]
        unused = [c for c in raw.column_names if c not in used]
        if unused:
            self.note(where, len(unused), f"column(s) not used: {unused} (task.columns names the ones used)")
        for name in used:
            column = raw[name]
            for row, text in enumerate(column):
                if not isinstance(text, str) or not text.strip():
                    what = "empty" if isinstance(text, str) or text is None else f"a {type(text).__name__}, not text"
                    raise UserError(
                        f"{where}, row {row + 1}: column {name!r} is {what}; every anchor, positive and negative must "
                        "be a text: fix or drop the row"
                    )
        return raw

    def cache_settings(self) -> list:
        return [self.max_seq_length, self.columns]

    def hub_source(self, split: str) -> tuple[str | None, str]:
        return self.hub_config, self.hub_splits[split]  # e.g. sentence-transformers/all-nli's "dev"

    # -- encoding ------------------------------------------------------------------------------------------------

    def encode(self, raw: datasets.Dataset, split: str, where: str) -> dict[str, datasets.Dataset]:
        columns = {**self.columns, "negatives": self._negatives[split]}
        encoded = raw.map(
            encode_rows,
            batched=True,
            remove_columns=raw.column_names,
            fn_kwargs={"columns": columns, "tokenizer": self.tokenizer, "max_seq_length": self.max_seq_length},
            load_from_cache_file=False,  # cached as a whole by the base
            desc=f"Tokenizing {split} pairs",
        )
        self.note(where, sum(encoded["cut"]), f"texts were cut to max_seq_length={self.max_seq_length} tokens")
        encoded = encoded.remove_columns(["cut"]).add_column("idx", list(range(len(encoded))))
        if split != "train":  # the corpus: each distinct positive once; a row's document is its positive's first row
            first: dict[int, int] = {}
            documents = [first.setdefault(keys[1], row) for row, keys in enumerate(encoded["text_keys"])]
            encoded = encoded.add_column("document", documents)
        return {split: encoded}

    def collator(self, train: bool) -> EmbeddingCollator:
        return EmbeddingCollator(self.tokenizer.pad_id, self.pad_to_multiple_of)

    def loader_columns(self, train: bool) -> list[str] | None:
        texts = ["anchor_ids", "positive_ids", "negative_ids"]
        return texts if train else [*texts, "document"]

    def loader(self, split: str, train: bool = False) -> DataLoader:
        if not train:
            return super().loader(split, train)
        assert self.datasets is not None, "call setup() first"
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        keys = self.datasets[split]["text_keys"]
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # the run's seed, the same in every process of the job
        sampler = NoDuplicatesSampler(keys, self.batch_size, world, rank, seed)
        batches = len(sampler.global_batches())
        if batches == 0:
            raise UserError(
                f"the training split's {len(keys)} pairs make no global batch of {sampler.global_batch} "
                f"(task.batch_size={self.batch_size} x {world} device(s)) without a text twice (too few pairs, or "
                "texts repeated across rows); lower task.batch_size or give more distinct pairs"
            )
        left = len(keys) - batches * sampler.global_batch
        if left and not getattr(self, "_said_left", False):
            self._said_left = True
            log.info(
                f"train: {len(keys)} pairs in {batches} global batches of {sampler.global_batch} in the first epoch, "
                f"no text twice in a batch; {left} pairs left out of it (past the last full batch, or repeating a "
                "text of every batch they could join) wait for a later epoch's shuffle"
            )
        dataset = self.datasets[split].select_columns(self.loader_columns(True))
        workers = self.workers(len(sampler) // self.batch_size)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            collate_fn=self.collator(True),
            num_workers=workers,
            persistent_workers=workers > 0,
            worker_init_fn=dataloader_worker_init,  # a SIGTERM to the whole process group is the run's to take
            pin_memory=torch.cuda.is_available(),
            drop_last=True,
        )
