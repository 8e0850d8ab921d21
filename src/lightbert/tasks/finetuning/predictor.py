"""The base of every task family's predictor: how a fine-tuned model reads new records and writes one prediction per
record (`src/predict.py`, lightbert.inference.predict). A record is one input line, a unit what the model runs on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from lightbert.errors import UserError

if TYPE_CHECKING:
    from lightbert.tasks.finetuned import FineTuned

Record = tuple[int, dict]  # (line number, the record)


@dataclass
class Unit:
    """One thing the model runs on: a sequence, or a multiple-choice example's choices (then lists of lists)."""

    record: int  # its record's position in the input
    input_ids: list
    token_type_ids: list
    choices: int = 0  # multiple choice: how many; batches hold examples with equal counts

    @property
    def length(self) -> int:
        return max(map(len, self.input_ids)) if self.choices else len(self.input_ids)

    @property
    def tokens(self) -> int:
        return sum(map(len, self.input_ids)) if self.choices else len(self.input_ids)


class Predictor:
    """How one kind of fine-tuned model reads records and writes its predictions (`src/predict.py`); each task family
    has its own, named in its head's record (lightbert.tasks.heads)."""

    reads = ""  # what a record holds, for messages
    plain_text = False  # reads plain text lines too
    per_token = False  # an output row per token (cut to each sequence's own length), not one per sequence
    options: tuple[str, ...] = ()  # the keys of src/predict.py's config (conf/predict.yaml) this predictor reads

    def __init__(self, finetuned: FineTuned, max_seq_length: int, options: dict | None = None):
        """`options`: the values of the command's keys that `options` names, where given (not null)."""
        self.finetuned, self.tokenizer, self.max_seq_length = finetuned, finetuned.tokenizer, max_seq_length
        self.notes: list[str] = []  # said on the console, once

    def text(self, record: Record, name: str) -> str:
        number, fields = record
        if name not in fields:
            raise UserError(
                f"input_file line {number}: no {name!r} field. init_from is {self.finetuned.describe()}, which reads "
                f"{self.reads}; this record has {sorted(fields) or 'no fields'}"
            )
        value = fields[name]
        if not isinstance(value, str):
            raise UserError(f"input_file line {number}: {name!r} must be a string, not {type(value).__name__}")
        if not value.strip():
            raise UserError(f"input_file line {number}: {name!r} is empty; give it some text, or leave the record out")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(
                f"input_file line {number}: {name!r} holds a lone surrogate (an escaped half of a character, e.g. "
                "\\ud800), which is no text; fix the line"
            ) from None
        return value

    def note_cut(self, records: list[Record], cut: list[bool], what: str) -> None:
        lines = [number for (number, _), was_cut in zip(records, cut, strict=True) if was_cut]
        if lines:
            shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
            self.notes.append(f"{len(lines)} record(s) {what} (input lines {shown})")

    def encode(self, records: list[Record]) -> list[Unit]:
        raise NotImplementedError

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> np.ndarray:
        """The model's outputs of a padded batch, one row per unit, as float32."""
        return model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).float().cpu().numpy()

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        """One prediction per record from the units' outputs (in the units' order)."""
        raise NotImplementedError


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits.astype(np.float64) - logits.max())
    return weights / weights.sum()
