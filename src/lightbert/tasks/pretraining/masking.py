"""The masked-LM collator: pads a batch of sentence pairs and masks it, fresh every time it is called.

As in the paper (§3.1) and the reference `create_masked_lm_predictions`: per sequence, 15% of the
non-special tokens (at least 1, at most `max_predictions_per_seq`) are chosen; of those 80% become
[MASK], 10% a random token and 10% stay unchanged; the model predicts the originals. The three shares are
settings (`MaskingShares`; Appendix C.2's Table 8 compares six). As the reference's `masked_lm_positions`, each
row also gets `max_predictions_per_seq` prediction slots (`masked_positions`, `prediction_positions`): the sparse MLM
head gathers them, a shape fixed in advance, where a boolean mask would give a count that changes every batch (a
graph break under torch.compile, a host sync every step on a GPU). Differences:
- The 15% is of the real tokens, not counting [CLS]/[SEP] (the reference counts them).
- Random replacements are drawn from the non-special vocabulary (the reference may draw [CLS] or [PAD]).
- Whole-word masking takes whole words in random order while they fit the budget and stops at the
  first that does not (the reference skips it and tries the next). This keeps the draw vectorised. A row whose
  first word does not fit takes the first that does (as the reference would), and where none does (every word
  longer than the budget) the first word's first pieces: every row predicts at least one token, as in the
  reference, whatever the masking and the slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lightbert.data.batches import pad_batch
from lightbert.data.encoding import IGNORE_INDEX
from lightbert.tasks.pretraining.objectives import MaskingShares


def max_predictions_for(max_seq_length: int, masked_lm_prob: float) -> int:
    """`max_predictions_per_seq` when it is not set: the expected count, max_seq_length x masked_lm_prob, rounded up
    to a multiple of 4. That gives the paper's values, 20 at 128 tokens and 80 at 512 (19.2 and 76.8 at 15%), and
    never caps a row: a row's budget is round(p x its non-special tokens), fewer than max_seq_length."""
    return min(max_seq_length, 4 * math.ceil(max_seq_length * masked_lm_prob / 4))


def prediction_positions(labels: torch.Tensor, slots: int) -> torch.Tensor:
    """(B, slots) positions of each row's predicted tokens (label != IGNORE_INDEX), in order, from (B, T) `labels`.

    A row's slots past its predictions point at its first unpredicted position (a [CLS]): its label, gathered the same
    way, is IGNORE_INDEX, so a padding slot counts in no loss or accuracy. A row with more predictions than slots is
    refused: the masking caps each row at `slots` (`MaskingCollator.max_predictions_per_seq`)."""
    predicted = labels != IGNORE_INDEX  # (B, T)
    counts = predicted.sum(1)  # (B,)
    if len(labels) and int(counts.max()) > slots:
        raise ValueError(f"a row has {int(counts.max())} predictions and room for {slots}")
    # Predicted positions first, each group in order (a stable sort of 0 for predicted, 1 for not).
    order = (~predicted).to(torch.uint8).argsort(dim=1, stable=True)  # (B, T)
    first_unpredicted = order.gather(1, counts.clamp(max=labels.shape[1] - 1)[:, None])  # (B, 1)
    positions = first_unpredicted.expand(-1, slots).clone()  # (B, slots)
    width = min(slots, labels.shape[1])
    filled = torch.arange(width) < counts[:, None]  # (B, width)
    positions[:, :width] = torch.where(filled, order[:, :width], positions[:, :width])
    return positions


@dataclass
class MaskingCollator:
    vocab_size: int
    pad_id: int
    mask_id: int
    special_ids: list[int]
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_masking: bool = False
    subword_ids: list[int] = field(default_factory=list)  # `##` pieces, needed for whole-word masking
    pad_to_multiple_of: int | tuple[int, ...] | None = None  # a tuple: length buckets (`pad_batch`)
    generator: torch.Generator | None = None
    shares: MaskingShares = field(default_factory=MaskingShares)

    def __post_init__(self) -> None:
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")
        self._is_special = torch.zeros(self.vocab_size, dtype=torch.bool)
        self._is_special[self.special_ids] = True
        self._is_subword = torch.zeros(self.vocab_size, dtype=torch.bool)
        self._is_subword[self.subword_ids] = True
        self._replacement_ids = (~self._is_special).nonzero().squeeze(1)
        if self.whole_word_masking and not self.subword_ids:
            raise ValueError("whole-word masking needs the tokenizer's `##` subword ids")

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.pad(examples)
        seeds = [e.get("mask_seed") for e in examples]
        randoms = self.example_randoms(seeds, batch["attention_mask"]) if None not in seeds else None
        batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"], randoms)
        batch["masked_positions"] = prediction_positions(batch["labels"], self.max_predictions_per_seq)
        return batch

    def example_randoms(self, seeds: list[int], attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The draws of `mask`, each row from its own example's seed: (unit keys, actions, replacement picks).

        A row's first n values (n its length) come from its seed alone, so an example is masked the same way
        whatever batch, device or padding it is in; the values past n are never read.
        """
        batch, seq_len = attention_mask.shape
        keys, actions = torch.zeros(batch, seq_len + 1), torch.zeros(batch, seq_len)
        picks = torch.zeros(batch, seq_len, dtype=torch.long)
        for row, (seed, n) in enumerate(zip(seeds, attention_mask.sum(1).tolist(), strict=True)):
            generator = torch.Generator().manual_seed(seed)
            keys[row, :n] = torch.rand(n, generator=generator)
            actions[row, :n] = torch.rand(n, generator=generator)
            picks[row, :n] = torch.randint(len(self._replacement_ids), (n,), generator=generator)
        return keys, actions, picks

    def pad(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        fields = {"next_sentence_label": ("next_sentence_label", torch.long)}
        return pad_batch(examples, self.pad_id, self.pad_to_multiple_of, fields)

    def select(self, input_ids: torch.Tensor, unit_keys: torch.Tensor | None = None) -> torch.Tensor:
        """Boolean (B, T) of the positions to predict; `unit_keys` (B, T + 1) are the random draws, if given."""
        candidates = ~self._is_special[input_ids]  # (B, T)
        budget = (candidates.sum(1) * self.masked_lm_prob).round().long()
        budget = budget.clamp(min=1, max=self.max_predictions_per_seq)  # (B,)

        # A "unit" is what gets chosen as a whole: one token, or one word (a piece plus its ## pieces).
        unit_start = candidates.clone()
        if self.whole_word_masking:
            previous_is_candidate = torch.nn.functional.pad(candidates[:, :-1], (1, 0), value=False)
            unit_start &= ~(self._is_subword[input_ids] & previous_is_candidate)
        seq_len = input_ids.shape[1]
        # (B, T) unit index of each candidate; special tokens and padding all go to a spare unit, seq_len.
        unit_id = (unit_start.long().cumsum(1) - 1).masked_fill(~candidates, seq_len)
        # Every unit draws a random key; its tokens share it. Non-candidates sort last.
        if unit_keys is None:
            unit_keys = torch.rand((input_ids.shape[0], seq_len + 1), generator=self.generator)
        unit_key = unit_keys.gather(1, unit_id)
        unit_key = unit_key.masked_fill(~candidates, 2.0)
        order = unit_key.argsort(dim=1, stable=True)  # units in random order, each unit's tokens contiguous
        taken = candidates.gather(1, order).long().cumsum(1)  # tokens taken up to and including this one
        # A unit is chosen when all its tokens fit the budget: its largest running count is within it.
        unit_total = torch.zeros((input_ids.shape[0], seq_len + 1), dtype=torch.long).scatter_reduce(
            1, unit_id.gather(1, order), taken, reduce="amax"
        )
        chosen = (unit_total.gather(1, unit_id) <= budget[:, None]) & candidates
        return self._at_least_one(chosen, candidates, unit_id, unit_keys, budget)

    @staticmethod
    def _at_least_one(
        chosen: torch.Tensor,
        candidates: torch.Tensor,
        unit_id: torch.Tensor,
        unit_keys: torch.Tensor,
        budget: torch.Tensor,
    ) -> torch.Tensor:
        """`chosen` (B, T) with a prediction in every row that has a candidate: a row whose first unit in random order
        did not fit its budget (a whole word of more pieces than the budget, e.g. 1 at 8 tokens or with one slot)
        takes the first unit in that order that fits, as the reference skips to the next word; where none fits, the
        first unit's first `budget` pieces. A batch of rows with nothing to predict would make the MLM loss NaN."""
        empty = ~chosen.any(1) & candidates.any(1)  # (B,)
        if not bool(empty.any()):
            return chosen
        sizes = torch.zeros(unit_keys.shape, dtype=torch.long).scatter_add(1, unit_id, candidates.long())  # (B, U)
        # Keys in [0, 1): the units that fit first, then the others, each in their random order; none, last.
        order = unit_keys + (sizes > budget[:, None]).float()
        pick = order.masked_fill(sizes == 0, 3.0).argmin(1)  # (B,)
        in_unit = (unit_id == pick[:, None]) & candidates
        first_pieces = in_unit & (in_unit.long().cumsum(1) <= budget[:, None])  # a word that fits: all of it
        return torch.where(empty[:, None], first_pieces, chosen)

    def mask(
        self, input_ids: torch.Tensor, randoms: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input ids, labels): labels hold the original id where chosen, IGNORE_INDEX elsewhere.

        `randoms` are `example_randoms`' draws; without them the collator's generator (or torch's) draws.
        """
        unit_keys, action, random_pick = randoms if randoms is not None else (None, None, None)
        chosen = self.select(input_ids, unit_keys)
        labels = input_ids.masked_fill(~chosen, IGNORE_INDEX)
        if action is None:
            action = torch.rand(input_ids.shape, generator=self.generator)
        to_mask = chosen & (action < self.shares.mask)
        to_random = chosen & (action >= self.shares.mask) & (action < self.shares.mask + self.shares.random)
        # the rest (shares.same) keep their token
        masked = input_ids.masked_fill(to_mask, self.mask_id)
        if random_pick is None:
            random_pick = torch.randint(len(self._replacement_ids), input_ids.shape, generator=self.generator)
        masked = torch.where(to_random, self._replacement_ids[random_pick], masked)
        return masked, labels


@dataclass
class NextTokenCollator:
    """The left-to-right LM's batches (the paper's LTR ablation): no masking; every real token but the last is
    labelled with the token that follows it, which the left-to-right encoder predicts from its left context."""

    pad_id: int
    pad_to_multiple_of: int | tuple[int, ...] | None = None  # a tuple: length buckets (`pad_batch`)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        fields = {"next_sentence_label": ("next_sentence_label", torch.long)}
        batch = pad_batch(examples, self.pad_id, self.pad_to_multiple_of, fields)
        input_ids, real = batch["input_ids"], batch["attention_mask"].bool()
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[:, :-1] = input_ids[:, 1:].masked_fill(~real[:, 1:], IGNORE_INDEX)
        batch["labels"] = labels
        return batch
