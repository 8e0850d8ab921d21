"""Multiple choice (SWAG) on new records: `src/predict.py`'s predictor for this head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lightbert.errors import UserError
from lightbert.tasks.finetuning.predictor import Predictor, Record, Unit, softmax
from lightbert.tasks.swag.data import continuations, encode_choice_pairs

if TYPE_CHECKING:
    pass


class MultipleChoice(Predictor):
    reads = '{"context": ..., "start": ... (optional), "endings": [...]} or SWAG\'s sent1, sent2, ending0..ending3'

    def choices(self, record: Record) -> tuple[str, str | None, list[str]]:
        number, fields = record
        if "sent1" in fields:  # SWAG's columns
            names = [f"ending{i}" for i in range(len(fields)) if f"ending{i}" in fields]
            return self.text(record, "sent1"), fields.get("sent2"), [self.text(record, n) for n in names]
        context = self.text(record, "context")
        endings = fields.get("endings")
        if not isinstance(endings, list) or len(endings) < 2:
            raise UserError(
                f"input_file line {number}: 'endings' must be a list of at least two strings; "
                f"init_from is {self.finetuned.describe()}, which reads {self.reads}"
            )
        if not all(isinstance(e, str) and e.strip() for e in endings):
            raise UserError(f"input_file line {number}: every ending must be a non-empty string")
        return context, fields.get("start"), endings

    def encode(self, records: list[Record]) -> list[Unit]:
        units, cut, self.endings = [], [], []
        for i, record in enumerate(records):
            context, start, endings = self.choices(record)
            self.endings.append(endings)
            if len(endings) < 2:
                raise UserError(f"input_file line {record[0]}: a multiple-choice record needs at least two endings")
            context_ids = self.tokenizer.encode_batch([context])[0]
            continued = self.tokenizer.encode_batch(continuations(start, endings))
            ids, types, was_cut = encode_choice_pairs(context_ids, continued, self.tokenizer, self.max_seq_length)
            units.append(Unit(i, ids, types, choices=len(endings)))
            cut.append(was_cut)
        self.note_cut(records, cut, f"were cut to max_seq_length={self.max_seq_length} tokens, as training cut them")
        return units

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        out = []
        for endings, scores in zip(self.endings, outputs, strict=True):
            choice = int(scores.argmax())
            probabilities = [round(float(p), 6) for p in softmax(scores)]
            out.append({"choice": choice, "ending": endings[choice], "probabilities": probabilities})
        return out
