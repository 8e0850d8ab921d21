"""Evaluation on several devices: each device its own share of a split, every device the same number of batches
(under FSDP a device with a batch fewer would leave the others waiting in a forward's all-gather), and the padding
batch that evens them out counted nowhere."""

from __future__ import annotations

import math
from dataclasses import asdict
from unittest import mock

import pytest
import torch
from helpers.models import TINY
from torch.utils.data import DataLoader

from lightbert.data.batches import (
    PADDING,
    PaddedSplit,
    PaddingAwareCollator,
    UnpaddedDistributedSampler,
    is_padding,
    pad_batch,
)
from lightbert.tasks.glue.module import SequenceClassificationModule


def shares(examples: int, world: int, batch_size: int) -> list[list[list[int]]]:
    """Each rank's batches of example indices, as its evaluation loader makes them."""
    split = PaddedSplit([{"input_ids": [i + 5], "token_type_ids": [0], "idx": i} for i in range(examples)])
    collate = PaddingAwareCollator(lambda rows: pad_batch(rows, 0, None, {"idx": ("idx", torch.long)}))
    loaders = [
        DataLoader(split, batch_size, sampler=UnpaddedDistributedSampler(split, world, rank, batch_size),
                   collate_fn=collate)
        for rank in range(world)
    ]  # fmt: skip
    return [[[-1] if is_padding(batch) else batch["idx"].tolist() for batch in loader] for loader in loaders]


@pytest.mark.parametrize(
    ("examples", "world", "batch_size"), [(9, 2, 4), (8, 2, 4), (10, 4, 2), (3, 4, 2), (1, 2, 8), (17, 3, 4)]
)
def test_every_device_runs_as_many_batches_and_every_example_counts_once(examples, world, batch_size):
    batches = shares(examples, world, batch_size)
    assert len({len(rank) for rank in batches}) == 1, batches  # the same number of batches on every device
    assert len(batches[0]) == math.ceil(math.ceil(examples / world) / batch_size)
    real = sorted(i for rank in batches for batch in rank if batch != [-1] for i in batch)
    assert real == list(range(examples))  # each example once; padding batches hold no real example
    # A padding batch is a batch of its own, the device's last: never mixed with real examples.
    assert all(batch == [-1] for rank in batches for batch in rank[:-1] if -1 in batch)


def test_with_fewer_examples_than_devices_each_device_has_a_batch():
    batches = shares(examples=3, world=4, batch_size=2)
    assert batches == [[[0]], [[1]], [[2]], [[-1]]]


def test_a_padding_batch_weighs_nothing_in_the_validation_metrics():
    """It runs through the model (the all-gathers of FSDP), adds weight 0 to the loss mean, and no prediction to the
    task's metrics; predict_step returns no row of it."""
    module = SequenceClassificationModule(asdict(TINY), {}, "sst2")
    rows = [{"input_ids": [2, 7, 3], "token_type_ids": [0, 0, 0], "label": 1, "idx": 0}]
    fields = {"label": ("labels", torch.long), "idx": ("idx", torch.long)}
    batch = PaddingAwareCollator(lambda r: pad_batch(r, 0, None, fields))([{**rows[0], PADDING: True}])
    assert is_padding(batch) and PADDING not in pad_batch(rows, 0)
    with mock.patch.object(module, "update_metrics") as update_metrics, mock.patch.object(module, "log"):
        module.validation_step(batch, 0)
    update_metrics.assert_not_called()
    assert float(module.val_losses[0].weight) == 0.0 and float(module.val_losses[0].mean_value) == 0.0
    predicted = module.predict_step(batch, 0)
    assert predicted["idx"].shape == (0,) and predicted["prediction"].shape == (0,)
