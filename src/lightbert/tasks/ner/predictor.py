"""Token classification (NER, part-of-speech tags) on new records: `src/predict.py`'s predictor for this head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lightbert.errors import UserError
from lightbert.tasks.finetuning.predictor import Predictor, Record, Unit
from lightbert.tasks.ner.data import encode_sentences
from lightbert.tasks.ner.metrics import entities, has_entities

if TYPE_CHECKING:
    pass


class TokenClassification(Predictor):
    reads = '{"words": [...]} (or "tokens"), {"text": ...} or plain text lines'
    plain_text = True

    def words(self, record: Record) -> tuple[list[str], list[tuple[int, int]] | None]:
        """The record's words and, for raw text, their character spans (BERT's pre-tokenizer: whitespace and
        punctuation, as CoNLL's words are split)."""
        number, fields = record
        for name in ("words", "tokens"):
            if name in fields:
                words = fields[name]
                if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
                    raise UserError(f"input_file line {number}: {name!r} must be a list of non-empty strings")
                if not words:
                    raise UserError(f"input_file line {number}: {name!r} is empty; give at least one word")
                return words, None
        text = self.text(record, "text")
        split = self.tokenizer.backend.pre_tokenizer.pre_tokenize_str(text)
        return [word for word, _ in split], [span for _, span in split]

    def encode(self, records: list[Record]) -> list[Unit]:
        self.split = [self.words(record) for record in records]
        words = [w for w, _ in self.split]
        rows, _ = encode_sentences(
            words, [[self.finetuned.labels[0]] * len(w) for w in words], self.tokenizer, self.finetuned.labels,
            self.max_seq_length,
        )  # fmt: skip
        self.word_starts = rows["word_starts"]
        cut = [-1 in starts for starts in self.word_starts]
        self.note_cut(
            records,
            cut,
            f"are longer than max_seq_length={self.max_seq_length} sub-tokens: the words cut "
            f"off are {'tagged O' if has_entities(self.finetuned.labels) else 'given no tag (null)'}, as in the run's "
            "evaluation",
        )
        return [
            Unit(i, ids, types)
            for i, (ids, types) in enumerate(zip(rows["input_ids"], rows["token_type_ids"], strict=True))
        ]

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        labels = self.finetuned.labels
        outside = "O" if has_entities(labels) else None  # a word cut off; part-of-speech tags have no "O"
        out = []
        for (_, fields), (words, spans), starts, logits in zip(
            records, self.split, self.word_starts, outputs, strict=True
        ):
            predicted = logits.argmax(-1)
            tags = [labels[int(predicted[s])] if s >= 0 else outside for s in starts]
            if outside is None:  # word classes, no entities to read off
                out.append({"words": words, "tags": tags})
                continue
            found = []
            for kind, first, last in entities(tags):
                entity = {
                    "type": kind,
                    "text": " ".join(words[first : last + 1]),
                    "word_start": first,
                    "word_end": last + 1,
                }
                if spans is not None:
                    text = fields["text"]
                    entity.update(start=spans[first][0], end=spans[last][1])
                    entity["text"] = text[spans[first][0] : spans[last][1]]
                found.append(entity)
            out.append({"words": words, "tags": tags, "entities": found})
        return out
