"""Batching shared by the fine-tuning DataModules: per-batch padding, evaluation splits longest first, and an
evaluation sampler for many devices."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from lightbert.cluster.processes import dataloader_worker_init
from lightbert.distributed import is_distributed
from lightbert.errors import ParameterError


@dataclass
class PaddingCollator:
    """Pads each batch to its longest sequence (rounded up to a multiple, for tensor cores).

    `fields` maps a per-example number in the rows to its name and dtype in the batch, e.g. GLUE's
    `{"label": ("labels", torch.long), "idx": ("idx", torch.long)}`; rows without a field leave it out.
    """

    pad_id: int
    fields: dict[str, tuple[str, torch.dtype]] = field(default_factory=dict)
    pad_to_multiple_of: int | tuple[int, ...] | None = 8  # a tuple: length buckets (`pad_batch`)

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        return pad_batch(rows, self.pad_id, self.pad_to_multiple_of, self.fields)


# The shortest length bucket (`length_buckets`): shorter batches are rare, and each bucket is a compiled graph.
SHORTEST_BUCKET = 32


def length_buckets(max_seq_length: int) -> tuple[int, ...]:
    """The lengths a compiled step's batches are padded up to (`speed.compile`, `run.speed.fix_batch_shapes`):
    powers of two from `SHORTEST_BUCKET`, then max_seq_length, which no sequence exceeds (128: 32, 64, 128; 384:
    32, 64, 128, 256, 384). Dynamo compiles one graph per bucket, where every batch length would be one graph each;
    a batch pads at most to twice its longest row, and attention masks the padding."""
    buckets, length = [], SHORTEST_BUCKET
    while length < max_seq_length:
        buckets.append(length)
        length *= 2
    return (*buckets, max_seq_length)


def padded_length(longest: int, pad_to: int | tuple[int, ...] | None) -> int:
    """The length a batch whose longest row is `longest` is padded to: a multiple of `pad_to` (tensor cores), or
    with a tuple of length buckets the first that holds it (a multiple of 8 past the last, which no row reaches)."""
    if isinstance(pad_to, tuple):
        return next((b for b in pad_to if b >= longest), math.ceil(longest / 8) * 8)
    return math.ceil(longest / pad_to) * pad_to if pad_to else longest


def pad_batch(
    rows: list[dict],
    pad_id: int,
    pad_to_multiple_of: int | tuple[int, ...] | None = None,
    fields: dict[str, tuple[str, torch.dtype]] | None = None,
) -> dict[str, torch.Tensor]:
    """`input_ids`, `token_type_ids` and `attention_mask` (B, T) padded to the longest row (`padded_length`: rounded
    up to `pad_to_multiple_of`, or to a length bucket when it is a tuple of them); plus `fields`."""
    length = padded_length(max(len(r["input_ids"]) for r in rows), pad_to_multiple_of)
    # One tensor per field from all rows at once, scattered under the mask: no per-row tensor.
    lengths = torch.tensor([len(r["input_ids"]) for r in rows])
    attention_mask = (torch.arange(length) < lengths[:, None]).long()  # (B, T)
    real = attention_mask.bool()
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    input_ids[real] = torch.tensor(list(chain.from_iterable(r["input_ids"] for r in rows)), dtype=torch.long)
    token_type_ids = torch.zeros((len(rows), length), dtype=torch.long)
    token_type_ids[real] = torch.tensor(list(chain.from_iterable(r["token_type_ids"] for r in rows)), dtype=torch.long)
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    for key, (name, dtype) in (fields or {}).items():
        if key in rows[0]:
            batch[name] = torch.tensor([r[key] for r in rows], dtype=dtype)
    return batch


# A batch key: true for a batch that every device runs only to stay in step with the others, counted nowhere.
PADDING = "padding"


class UnpaddedDistributedSampler(DistributedSampler):
    """Rank r gets examples r, r + W, r + 2W, ...: every example exactly once, none repeated.

    `DistributedSampler` pads the split to a multiple of the world size by repeating examples, which would count
    them twice in validation metrics. Subclassing it keeps Lightning from replacing this sampler with its own.

    With `batch_size`, every rank makes the same number of batches: under FSDP each forward gathers the weights from
    every device, so a rank with a batch fewer (or, with fewer examples than devices, none) would leave the others
    waiting for ever. The shares differ by one example at most, so a rank short of a batch holds a whole number of
    batches and ends with one index more, `len(dataset)`, alone in its batch: `PaddedSplit` reads it as padding.
    """

    def __init__(
        self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None, batch_size: int | None = None
    ):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)
        self.batch_size = batch_size

    def _indices(self) -> list[int]:
        mine = list(range(self.rank, len(self.dataset), self.num_replicas))
        if self.batch_size is not None:
            most = len(range(0, len(self.dataset), self.num_replicas))  # rank 0's share is the largest
            if math.ceil(len(mine) / self.batch_size) < math.ceil(most / self.batch_size):
                mine.append(len(self.dataset))
        return mine

    def __iter__(self):
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


class PaddedSplit(Dataset):
    """`dataset` as it is, and one index past its end: its first example again, marked as padding (`PADDING`)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        if index == len(self.dataset):
            return {**self.dataset[0], PADDING: True}
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[dict]:
        if len(self.dataset) in indices or not hasattr(self.dataset, "__getitems__"):
            return [self[i] for i in indices]
        return self.dataset.__getitems__(indices)  # one read for the batch (a datasets.Dataset, SeededExamples)


@dataclass
class PaddingAwareCollator:
    """`collate`, and `PADDING: True` in a batch of padding rows (which `UnpaddedDistributedSampler` never mixes with
    real ones)."""

    collate: Callable[[list[dict]], dict]

    def __call__(self, rows: list[dict]) -> dict:
        if rows and PADDING in rows[0]:
            return {**self.collate([{k: v for k, v in r.items() if k != PADDING} for r in rows]), PADDING: True}
        return self.collate(rows)


def is_padding(batch: dict) -> bool:
    return bool(batch.get(PADDING, False))


def examples_in(batch: dict) -> int | torch.Tensor:
    """The examples a batch holds: its first dimension ((B, T), or (B, C, T) for multiple choice), or in packed rows
    the filled slots (a device tensor: nothing waits for the GPU); an embedding batch its `rows` (pairs or triplets,
    whose texts are its first dimension)."""
    if "rows" in batch:
        return batch["rows"]
    if "example_index" in batch:
        return (batch["example_index"] >= 0).sum()
    return batch["attention_mask"].shape[0]


def evaluation_shares(
    dataset: Dataset, collate_fn: Callable, batch_size: int
) -> tuple[Dataset, Sampler | None, Callable]:
    """(dataset, sampler, collate_fn) of an evaluation loader: on several devices each its own share of `dataset`,
    every device the same number of batches (some ending with a padding batch, `is_padding`)."""
    if not is_distributed():
        return dataset, None, collate_fn
    split = PaddedSplit(dataset)
    return split, UnpaddedDistributedSampler(split, batch_size=batch_size), PaddingAwareCollator(collate_fn)


def longest_first(dataset, column: str = "input_ids"):
    """A tokenised split (a `datasets.Dataset` with `input_ids`, or the token ids `column` names), its examples
    longest first (ties in order).

    For evaluation and prediction: each batch then holds examples of similar length and pads to its own longest only,
    and a batch too big for the device fails at the first step. Predictions and metrics are keyed by each example's
    `idx` or summed, so the order changes no number. Multiple choice (C, T) examples count their longest choice."""
    column = dataset.with_format("arrow")[column]
    if pa.types.is_list(column.type.value_type):
        per_choice = pc.list_value_length(pc.list_flatten(column)).to_numpy()
        lengths = np.zeros(len(dataset), dtype=np.int64)
        np.maximum.at(lengths, pc.list_parent_indices(column).to_numpy(), per_choice)
    else:
        lengths = pc.list_value_length(column).to_numpy()
    return dataset.select(np.argsort(-lengths, kind="stable"))


# Evaluation and prediction batches on a GPU (task.datamodule.eval_batch_size=null, predict.py's batch_size=auto):
# sorted by length, inference without gradients holds little memory, and bigger batches keep the GPU busy.
GPU_EVAL_BATCH_SIZE = 256


def evaluation_batch_size(eval_batch_size: int | None, batch_size: int, device: torch.device) -> int:
    """task.datamodule.eval_batch_size, or for null: task.batch_size on a CPU (the cores are busy already), at least
    `GPU_EVAL_BATCH_SIZE` on a GPU."""
    if eval_batch_size is not None:
        return eval_batch_size
    return batch_size if device.type == "cpu" else max(batch_size, GPU_EVAL_BATCH_SIZE)


# Fewer batches than this in a split: worker processes take longer to start than the batches take to collate.
MIN_BATCHES_FOR_WORKERS = 100


def check_num_workers(num_workers: int | str) -> None:
    if num_workers != "auto" and (not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0):
        raise ParameterError(f"{{0}} must be a number of processes (0 or more) or auto, got {num_workers!r}",
                             "num_workers")  # fmt: skip


def loader_workers(num_workers: int | str, device: torch.device, num_batches: int, local_devices: int = 1) -> int:
    """`num_workers`, or for "auto" a number chosen by the machine: none on a CPU (collating tokenised rows takes
    milliseconds, and the cores are the model's) or for a small split; on a GPU, up to 4 per device from the cores
    this process may use, one left for the process itself (the GPU then never waits for a batch)."""
    check_num_workers(num_workers)
    if num_workers != "auto":
        return int(num_workers)
    if device.type != "cuda" or num_batches < MIN_BATCHES_FOR_WORKERS:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(4, cores // max(1, local_devices) - 1))


def make_loader(dataset: Dataset, collate_fn, batch_size: int, train: bool, num_workers: int) -> DataLoader:
    """Shuffled for training; for evaluation in order, each device its own share (`evaluation_shares`)."""
    sampler = None
    if not train:
        dataset, sampler, collate_fn = evaluation_shares(dataset, collate_fn, batch_size)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        sampler=sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        persistent_workers=num_workers > 0 and train,
        worker_init_fn=dataloader_worker_init,  # a SIGTERM to the whole process group is the run's to take
        pin_memory=torch.cuda.is_available(),
    )
