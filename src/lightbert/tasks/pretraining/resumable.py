"""A training order that any number of devices share and that a resumed run picks up at the exact next batch.

- `StepSampler` shuffles the examples once per epoch with a seed of its own (never the global RNG), cuts the
  permutation into batches, and gives device r of W the batches r, r + W, r + 2W, ...: every example at most once
  per epoch, and optimizer step k always sees the same global batch, whether it comes from W devices or from
  one device accumulating W micro-batches. A resumed run starts at the batch after the last optimizer step.
- `SeededExamples` hands the collator, with each example, a seed derived from (seed, epoch, example index), so an
  example's masks depend on nothing else: not on the batch it lands in, the device, the DataLoader worker or
  the point a run was resumed at.
- `SeededPermutation` is the shuffle: a seeded bijection of [0, n) evaluated for the positions a batch needs, so
  a device holds no permutation of the whole corpus (`torch.randperm` of 458M examples took 3.7 GB and 32 s per
  process and epoch).
- `Position` is where a run stands (rank, world size, accumulation, steps done), which each example source starts
  from; `StepResumedLoader` is the DataLoader that Lightning then treats as resumable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def example_seed(seed: int, epoch: int | str, index: int) -> int:
    """A 63-bit seed for one example in one epoch ("validation" for the fixed validation masks)."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SeededExamples(Dataset):
    """Rows of `dataset`, each with a `mask_seed`; indexed by the (epoch, index) pairs `StepSampler` yields."""

    def __init__(self, dataset, seed: int, epoch: int | str | None = None):
        self.dataset, self.seed, self.epoch = dataset, seed, epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def _key(self, key) -> tuple[int | str, int]:
        if self.epoch is not None:  # a fixed epoch: plain indices (validation)
            return self.epoch, key
        # A plain index where a pair is expected: Lightning's own sampler replaced StepSampler (debug=overfit's
        # overfit_batches), so every pass sees the same rows with the same masks.
        return key if isinstance(key, tuple | list) else (0, key)

    def __getitem__(self, key) -> dict:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list) -> list[dict]:
        pairs = [self._key(k) for k in keys]
        indices = [index for _, index in pairs]
        if isinstance(self.dataset, list):  # examples in memory (a streamed corpus's validation split)
            rows = [self.dataset[i] for i in indices]
        else:
            columns = self.dataset[indices]  # one Arrow read for the whole batch
            rows = [{c: values[i] for c, values in columns.items()} for i in range(len(indices))]
        seeds = [example_seed(self.seed, epoch, index) for epoch, index in pairs]
        return [{**row, "mask_seed": seed} for row, seed in zip(rows, seeds, strict=True)]


class SeededPermutation:
    """A pseudo-random permutation of [0, n) that maps any positions to their values without building the whole.

    A balanced Feistel network on the smallest even number of bits 2h with 4^h >= n (so fewer than 4n values),
    each of its 6 rounds keyed from (seed, epoch) through blake2b; a value that lands outside [0, n) is sent
    through the network again until it lands inside (cycle walking), which keeps the map a bijection of [0, n)
    because the network is a bijection of [0, 4^h). Each value takes at most a few passes on average (< 4n / n).
    """

    ROUNDS = 6

    def __init__(self, n: int, seed: int, epoch: int):
        if n < 1:
            raise ValueError(f"a permutation of {n} items")
        self.n = n
        self.half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        digest = hashlib.blake2b(f"feistel/{seed}/{epoch}".encode(), digest_size=8 * self.ROUNDS).digest()
        self.keys = np.frombuffer(digest, dtype="<u8").astype(np.uint64)

    def _round(self, right: np.ndarray, key: np.uint64) -> np.ndarray:
        # splitmix64's finaliser of (right + key): every output bit depends on every input bit.
        z = right + key
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    def _network(self, values: np.ndarray) -> np.ndarray:
        bits = np.uint64(self.half_bits)
        mask = np.uint64((1 << self.half_bits) - 1)
        left, right = values >> bits, values & mask
        for key in self.keys:
            left, right = right, left ^ (self._round(right, key) & mask)
        return (left << bits) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The permuted values (int64) of `positions` (integers in [0, n))."""
        values = self._network(np.asarray(positions, dtype=np.uint64))
        outside = values >= self.n
        while outside.any():
            values[outside] = self._network(values[outside])
            outside = values >= self.n
        return values.astype(np.int64)


class StepSampler(DistributedSampler):
    """Yields this device's (epoch, example index) pairs, a batch after another, from `start_step` on.

    Subclassing `DistributedSampler` keeps Lightning from wrapping it in one of its own. Each epoch holds a whole
    number of optimizer steps: the batches that do not fill one (at most W·A - 1) are dropped, as `drop_last`
    drops a partial batch.
    """

    def __init__(
        self,
        num_examples: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        accumulate: int = 1,
        start_step: int = 0,
    ):
        # DistributedSampler's own state is not used; it only needs a sized dataset.
        super().__init__(range(num_examples), num_replicas=world_size, rank=rank, shuffle=False)
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.rank, self.world_size, self.accumulate = rank, world_size, accumulate
        per_step = batch_size * world_size * accumulate  # examples per optimizer step, all devices
        self.steps_per_epoch = num_examples // per_step
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{num_examples} training examples do not fill one optimizer step of {per_step} "
                f"(batch {batch_size} x {world_size} device(s) x {accumulate} accumulated)"
            )
        self.next_epoch, self.skip_steps = divmod(start_step, self.steps_per_epoch)

    def __len__(self) -> int:  # this device's examples in a full epoch
        return self.steps_per_epoch * self.accumulate * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Ignored: the epoch follows from the steps taken, also when a run resumes at the end of an epoch."""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, skip = self.next_epoch, self.skip_steps
        self.next_epoch, self.skip_steps = epoch + 1, 0
        order = SeededPermutation(self.num_examples, self.seed, epoch)
        batches = self.steps_per_epoch * self.accumulate  # of this device in this epoch
        # Batches are computed 256 at a time: numpy's cost per call, not per value, dominates for one batch.
        within = np.arange(self.batch_size)
        for first in range(skip * self.accumulate, batches, 256):
            starts = (np.arange(first, min(first + 256, batches)) * self.world_size + self.rank) * self.batch_size
            for index in order((starts[:, None] + within).ravel()).tolist():
                yield epoch, index


class Position(NamedTuple):
    """Where a run stands: its rank, world size, batches accumulated per step and steps this data has given."""

    rank: int
    world_size: int
    accumulate: int
    steps_done: int


class StepResumedLoader(DataLoader):
    """A DataLoader that Lightning treats as resumable, which it is by construction: its sampler (`StepSampler`, or
    the stream's position) starts from the step the run resumes at, computed from the trainer's global step, so
    there is no state of its own to save (without these two methods Lightning warns on every mid-epoch resume that
    the loader "is not resumable")."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: the position follows from the global step (`PretrainDataModule._position`)."""
