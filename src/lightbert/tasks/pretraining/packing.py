"""Packed pre-training batches (`task.datamodule.packing=true`): several examples in each row of `max_seq_length`
tokens, so a batch carries almost no padding and its width never changes.

Each example is masked exactly as it would be alone (its own mask seed, `MaskingCollator`), then placed whole in a
row (first fit, longest first). It keeps its own [CLS], segments, positions (from 0), MLM labels and NSP label;
attention stays within it (`lightbert.model.layouts.document_mask`), and the pooler and NSP head read its own [CLS].
Every tensor's shape but the row count is fixed in advance: `max_examples_per_row` slots per row for the [CLS]
positions and NSP labels, and `prediction_slots` positions per row for the sparse MLM head, so the model runs with
no host sync and compiles to one graph (the row count is marked dynamic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.model import PackedRows
from lightbert.tasks.pretraining.masking import MaskingCollator, prediction_positions

PACKED_KEYS = ("document_ids", "position_ids", "cls_positions")


def prediction_slots(width: int, masked_lm_prob: float, max_examples_per_row: int) -> int:
    """Enough MLM positions for any row: an example of n tokens gets at most round(p * n) >= 1 predictions, so a
    row of examples totalling `width` tokens gets at most p * width + one per example."""
    return min(width, math.floor(masked_lm_prob * width) + max_examples_per_row)


def fixed_row_counts(batch_size: int, max_examples_per_row: int, empty_share: float = 0.08) -> tuple[int, ...]:
    """The row counts a packed batch of up to `batch_size` examples is padded up to where shapes must be fixed (CUDA
    graphs record one graph per input shape): from the fewest rows the examples fit in (`max_examples_per_row` to a
    row) up to `batch_size` (each alone), each count about `empty_share` above the one before, so that padding up to
    the next count adds under that share of empty rows. A run's batches need row counts in a narrow band (their
    lengths follow one distribution), so they meet only a few of these counts."""
    counts = [batch_size]
    fewest = math.ceil(batch_size / max_examples_per_row)
    while counts[-1] > fewest:
        counts.append(max(fewest, min(counts[-1] - 1, math.floor(counts[-1] * (1 - empty_share)))))
    return tuple(reversed(counts))


def first_fit(lengths: list[int], width: int, max_examples_per_row: int) -> list[list[int]]:
    """Rows of example indices: longest first, each into the first row it fits (room and a free slot)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > width:
            raise ValueError(f"an example of {lengths[i]} tokens does not fit a row of {width}")
        open_rows = (r for r, free in enumerate(room) if lengths[i] <= free and len(rows[r]) < max_examples_per_row)
        fits = next(open_rows, -1)
        if fits < 0:
            rows.append([])
            room.append(width)
            fits = len(rows) - 1
        rows[fits].append(i)
        room[fits] -= lengths[i]
    return rows


def pack_batch(
    batch: dict[str, torch.Tensor],
    width: int,
    max_examples_per_row: int,
    slots: int,
    pad_id: int = 0,
    row_counts: tuple[int, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """A masked, padded batch (B, T <= width) -> packed rows (R, width), R <= B. Adds `document_ids`,
    `position_ids`, `cls_positions` (R, K), `masked_positions` (R, slots) and `example_index` (R, K: the example of
    each slot, -1 for an empty one); `next_sentence_label` becomes (R, K), IGNORE_INDEX in empty slots.

    `row_counts` (ascending): R is the first that holds the rows, the rest empty rows (all padding, every slot
    empty), which change no loss or metric."""
    lengths = batch["attention_mask"].sum(1).tolist()
    rows = first_fit(lengths, width, max_examples_per_row)
    count = next((c for c in row_counts or () if c >= len(rows)), len(rows))
    shape, slots_shape = (count, width), (count, max_examples_per_row)
    out = {
        "input_ids": torch.full(shape, pad_id, dtype=torch.long),
        "token_type_ids": torch.zeros(shape, dtype=torch.long),
        "attention_mask": torch.zeros(shape, dtype=torch.long),
        "labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long),
        "document_ids": torch.zeros(shape, dtype=torch.long),
        "position_ids": torch.zeros(shape, dtype=torch.long),
        "cls_positions": torch.zeros(slots_shape, dtype=torch.long),
        "example_index": torch.full(slots_shape, -1, dtype=torch.long),
    }
    nsp = batch.get("next_sentence_label")
    if nsp is not None:
        out["next_sentence_label"] = torch.full(slots_shape, IGNORE_INDEX, dtype=torch.long)
    for r, members in enumerate(rows):
        start = 0
        for slot, i in enumerate(members):
            n, end = lengths[i], start + lengths[i]
            for key in ("input_ids", "token_type_ids", "attention_mask", "labels"):
                out[key][r, start:end] = batch[key][i, :n]
            out["document_ids"][r, start:end] = slot + 1
            out["position_ids"][r, start:end] = torch.arange(n)
            out["cls_positions"][r, slot] = start
            out["example_index"][r, slot] = i
            if nsp is not None:
                out["next_sentence_label"][r, slot] = nsp[i]
            start = end
    # Every row's slots, the empty rows' too (all at position 0, unlabelled): the MLM logits are (count, slots, V).
    out["masked_positions"] = prediction_positions(out["labels"], slots)
    return out


@dataclass
class PackingCollator:
    """Masks each example as `MaskingCollator` does alone, then packs the batch into rows of `width` tokens."""

    masking: MaskingCollator
    width: int
    max_examples_per_row: int = 8
    row_counts: tuple[int, ...] | None = None  # pad the row count up to one of these (`fixed_row_counts`)

    def __post_init__(self) -> None:
        self.slots = prediction_slots(self.width, self.masking.masked_lm_prob, self.max_examples_per_row)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.masking(examples)
        return pack_batch(
            batch, self.width, self.max_examples_per_row, self.slots, self.masking.pad_id, self.row_counts
        )


def packed_rows(batch: dict) -> PackedRows | None:
    """The model's view of a packed batch, or None for a plain one."""
    if "document_ids" not in batch:
        return None
    return PackedRows(*(batch[key] for key in PACKED_KEYS))
