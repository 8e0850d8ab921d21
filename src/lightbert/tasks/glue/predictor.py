"""GLUE-style sequence classification on new records: `src/predict.py`'s predictor for this head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lightbert.tasks.finetuning.predictor import Predictor, Record, Unit, softmax
from lightbert.tasks.glue.data import encode_examples
from lightbert.tasks.glue.tasks import glue_task

if TYPE_CHECKING:
    from lightbert.tasks.finetuned import FineTuned


class SequenceClassification(Predictor):
    plain_text = True

    def __init__(self, finetuned: FineTuned, max_seq_length: int, options: dict | None = None):
        super().__init__(finetuned, max_seq_length, options)
        self.task_columns = glue_task(finetuned.task).text_columns if finetuned.task else ()
        own = f" or its task's columns {list(self.task_columns)}" if self.task_columns else ""
        self.reads = '{"text": ..., "text_pair": ... (optional)}' + own + ", or plain text lines"

    def columns(self, record: Record) -> tuple[str, ...]:
        fields = record[1]
        if self.task_columns and all(c in fields for c in self.task_columns):
            return self.task_columns
        return ("text", "text_pair") if "text_pair" in fields else ("text",)

    def encode(self, records: list[Record]) -> list[Unit]:
        units: list[Unit | None] = [None] * len(records)
        by_columns: dict[tuple[str, ...], list[int]] = {}
        for i, record in enumerate(records):
            by_columns.setdefault(self.columns(record), []).append(i)
        cut = [False] * len(records)
        for columns, members in by_columns.items():  # encoded as GLUE's training encoded its rows
            batch = {c: [self.text(records[i], c) for i in members] for c in columns}
            encoded = encode_examples(batch, self.tokenizer, columns, self.max_seq_length)
            for k, i in enumerate(members):
                units[i] = Unit(i, encoded["input_ids"][k], encoded["token_type_ids"][k])
                cut[i] = encoded["cut"][k]
        self.note_cut(records, cut, f"were cut to max_seq_length={self.max_seq_length} tokens, as training cut them")
        return units

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        labels = self.finetuned.labels
        out = []
        for logits in outputs:
            if self.finetuned.is_regression:
                out.append({"score": round(float(logits[0]), 6)})
                continue
            probabilities = softmax(logits)
            out.append(
                {
                    "label": labels[int(logits.argmax())],
                    "probabilities": {name: round(float(p), 6) for name, p in zip(labels, probabilities, strict=True)},
                }
            )
        return out
