"""Sentence embeddings of new texts: `src/predict.py`'s predictor for the embedding head, one `{"embedding": [...]}`
line per input line (the vector as the model gives it: pooled, and normalised where the model normalises)."""

from __future__ import annotations

import numpy as np

from lightbert.tasks.embedding.data import encode_texts
from lightbert.tasks.finetuning.predictor import Predictor, Record, Unit


class Embedding(Predictor):
    plain_text = True
    reads = '{"text": ...} or plain text lines'

    def encode(self, records: list[Record]) -> list[Unit]:
        texts = [self.text(record, "text") for record in records]
        ids, cut = encode_texts(texts, self.tokenizer, self.max_seq_length)
        self.note_cut(records, cut, f"were cut to max_seq_length={self.max_seq_length} tokens, as training cut them")
        return [Unit(i, one, [0] * len(one)) for i, one in enumerate(ids)]

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        return [{"embedding": [float(x) for x in vector]} for vector in outputs]
