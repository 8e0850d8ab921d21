"""A fine-tuned model on new text: `python src/predict.py init_from=... input_file=... output_file=...` (see README).

One record per input line, one prediction per output line, in the input's order (an input `id` is copied over):

- sequence classification (GLUE-style): `{"text": ..., "text_pair": ...}` (the pair optional) or the task's own
  columns (`sentence`, `premise`/`hypothesis`, ...), or plain text lines -> `{"label", "probabilities"}`, or
  `{"score"}` for a regression (STS-B);
- question answering (SQuAD): `{"question", "context"}` -> `{"answer", "start", "end", "score", "no_answer"}`
  (`start`/`end`: characters of the context; v2.0 adds `null_odds`, and answers "" when they exceed the run's
  threshold, as its dev predictions did);
- token classification (NER): `{"words": [...]}` (or `tokens`), or `{"text": ...}` / plain text lines, split into
  words as BERT's pre-tokenizer splits them -> `{"words", "tags", "entities"}` (entities with character offsets
  when the input was text);
- multiple choice (SWAG): `{"context", "endings": [...]}` (an optional `start` of the next sentence), or SWAG's
  columns `sent1, sent2, ending0..3` -> `{"choice", "ending", "probabilities"}`.

Every record is encoded by the function its training used. The model runs on batches of sequences sorted by
length, each padded to its own longest only, and the encoder skips that padding too (`BertModel.unpad`): what a
record gets does not depend on the batch size or on the other records.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch
from omegaconf import DictConfig

from lightbert.data.batches import pad_batch
from lightbert.data.conll import encode_sentences
from lightbert.data.glue import encode_examples, glue_task
from lightbert.data.squad import Windowing, make_windows
from lightbert.data.swag import continuations, encode_choice_pairs
from lightbert.errors import UserError
from lightbert.eval.ner import entities
from lightbert.eval.squad_answers import SquadAnswers
from lightbert.files import open_atomically, read_input_text
from lightbert.finetuned import FineTuned, load_finetuned

Record = tuple[int, dict]  # (line number, the record)


def say(message: str) -> None:
    """The console: stderr, so that `output_file=-` leaves stdout to the predictions."""
    print(f"lightbert: {message}", file=sys.stderr)


# -- records in ----------------------------------------------------------------------------------------------


def read_records(input_file: str, input_format: str = "auto") -> tuple[list[Record], str]:
    """The non-blank lines of `input_file` (`-`: stdin) as records, and the format they were read in."""
    if input_format not in ("auto", "jsonl", "text"):
        raise UserError(f"input_format={input_format} is not known; use auto, jsonl or text")
    text = sys.stdin.read() if input_file == "-" else read_input_text(input_file)
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise UserError(f"input_file={input_file} holds no records; write one JSON object (or text) per line")
    if input_format == "auto":
        input_format = "jsonl" if lines[0][1].lstrip().startswith("{") else "text"
    if input_format == "text":
        return [(number, {"text": line.strip()}) for number, line in lines], "text"
    records = []
    for number, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(
                f"input_file line {number} is not valid JSON ({error.msg}); write one object per line"
            ) from None
        if not isinstance(record, dict):
            raise UserError(f"input_file line {number} is not a JSON object; write one object per line")
        records.append((number, record))
    return records, "jsonl"


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


# -- the heads -----------------------------------------------------------------------------------------------


class Head:
    """How one kind of fine-tuned model reads records and writes its predictions."""

    reads = ""  # what a record holds, for messages
    plain_text = False  # reads plain text lines too

    def __init__(self, finetuned: FineTuned, max_seq_length: int):
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


class SequenceClassification(Head):
    plain_text = True

    def __init__(self, finetuned: FineTuned, max_seq_length: int):
        super().__init__(finetuned, max_seq_length)
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


class TokenClassification(Head):
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
            words, [["O"] * len(w) for w in words], self.tokenizer, self.finetuned.labels, self.max_seq_length
        )
        self.word_starts = rows["word_starts"]
        cut = [-1 in starts for starts in self.word_starts]
        self.note_cut(
            records,
            cut,
            f"are longer than max_seq_length={self.max_seq_length} sub-tokens: the words cut "
            "off are tagged O, as in the run's evaluation",
        )
        return [
            Unit(i, ids, types)
            for i, (ids, types) in enumerate(zip(rows["input_ids"], rows["token_type_ids"], strict=True))
        ]

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        labels = self.finetuned.labels
        outside = labels.index("O") if "O" in labels else 0
        out = []
        for (_, fields), (words, spans), starts, logits in zip(
            records, self.split, self.word_starts, outputs, strict=True
        ):
            predicted = logits.argmax(-1)
            tags = [labels[int(predicted[s]) if s >= 0 else outside] for s in starts]
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


NO_ANSWERS = {"text": [], "answer_start": []}  # a new question has no gold answers


class QuestionAnswering(Head):
    reads = '{"question": ..., "context": ...}'

    def __init__(self, finetuned: FineTuned, max_seq_length: int, null_threshold: float | None = None):
        super().__init__(finetuned, max_seq_length)
        settings = finetuned.settings
        self.version_2 = str(settings["version"]) == "2.0"
        self.threshold = settings["null_threshold"] if null_threshold is None else null_threshold
        self.windowing = Windowing(max_seq_length, settings["doc_stride"], settings["max_query_length"])

    def encode(self, records: list[Record]) -> list[Unit]:
        questions = [self.text(r, "question") for r in records]
        contexts = [self.text(r, "context") for r in records]
        ids = [str(fields.get("id", number)) for number, fields in records]
        examples = datasets.Dataset.from_dict(
            {
                "id": ids,
                "context": contexts,
                "question": questions,
                "answers": [{"text": [], "answer_start": []}] * len(ids),
            }
        )
        rows, problems = make_windows(examples, self.tokenizer, self.windowing, training=False, version_2=True)
        cut = [i in set(problems.ids.get("question_truncated", [])) for i in ids]
        self.note_cut(
            records,
            cut,
            f"have questions longer than max_query_length={self.windowing.max_query_length} "
            "tokens: cut to it, as in training",
        )
        windows = datasets.Dataset.from_dict({k: rows[k] for k in ("example_idx", "offsets", "max_context")})
        settings = self.finetuned.settings
        self.answers = SquadAnswers(
            examples, windows, self.version_2, settings["n_best_size"], settings["max_answer_length"]
        )
        return [
            Unit(e, i, t)
            for e, i, t in zip(rows["example_idx"], rows["input_ids"], rows["token_type_ids"], strict=True)
        ]

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> np.ndarray:
        start, end = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return torch.stack([start, end], dim=-1).float().cpu().numpy()  # (B, T, 2)

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        logits = {window: output for window, output in enumerate(outputs)}
        out = []
        for example in range(len(records)):
            answer = self.answers.answer(example, logits)
            no_answer = answer.start is None or (self.version_2 and answer.null_odds > self.threshold)
            probability = next((c["probability"] for c in answer.nbest if c["text"] == answer.text), 0.0)
            prediction = {
                "answer": "" if no_answer else answer.text,
                "start": None if no_answer else answer.start,
                "end": None if no_answer else answer.end,
                "score": 0.0 if no_answer else round(probability, 6),
                "no_answer": no_answer,
            }
            if self.version_2:
                prediction["null_odds"] = round(answer.null_odds, 6)
            out.append(prediction)
        return out


class MultipleChoice(Head):
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


HEADS = {
    "sequence_classification": SequenceClassification,
    "token_classification": TokenClassification,
    "question_answering": QuestionAnswering,
    "multiple_choice": MultipleChoice,
}


# -- running -------------------------------------------------------------------------------------------------


def length_sorted_batches(units: list[Unit], batch_size: int) -> Iterator[list[int]]:
    """Unit indices in batches of similar length (longest first), each with one number of choices."""
    order = sorted(range(len(units)), key=lambda i: (units[i].choices, -units[i].length, i))
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) == batch_size or units[batch[0]].choices != units[i].choices):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def padded(units: list[Unit], pad_id: int) -> dict[str, torch.Tensor]:
    """The batch padded to its longest sequence only; multiple choice as (B, C, T)."""
    if not units[0].choices:
        return pad_batch([{"input_ids": u.input_ids, "token_type_ids": u.token_type_ids} for u in units], pad_id)
    flat = [
        {"input_ids": i, "token_type_ids": t} for u in units for i, t in zip(u.input_ids, u.token_type_ids, strict=True)
    ]
    return {k: v.view(len(units), units[0].choices, -1) for k, v in pad_batch(flat, pad_id).items()}


def run(
    head: Head, units: list[Unit], batch_size: int, device: torch.device, progress: bool = False
) -> list[np.ndarray]:
    """Each unit's output (a sequence's own length for per-token heads)."""
    from tqdm.auto import tqdm

    model = head.finetuned.model.to(device).eval()
    outputs: list[np.ndarray | None] = [None] * len(units)
    batches = list(length_sorted_batches(units, batch_size))
    per_token = head.finetuned.head in ("token_classification", "question_answering")
    with torch.inference_mode():
        shown = tqdm(batches, desc="predicting", unit="batch", disable=None if progress else True, file=sys.stderr)
        for members in shown:  # a bar where stderr is a terminal
            batch = {k: v.to(device) for k, v in padded([units[i] for i in members], head.tokenizer.pad_id).items()}
            for i, row in zip(members, head.outputs(model, batch), strict=True):
                outputs[i] = row[: units[i].length].copy() if per_token else row
    return outputs


@dataclass
class Predicted:
    predictions: list[dict]
    units: int
    tokens: int
    seconds: float


def predict_records(
    finetuned: FineTuned,
    records: list[Record],
    batch_size: int = 64,
    max_seq_length: int | None = None,
    device: torch.device | str = "cpu",
    null_threshold: float | None = None,
    progress: bool = False,
) -> tuple[Predicted, Head]:
    """Every record's prediction, in order."""
    started = time.perf_counter()
    max_seq_length = max_seq_length or finetuned.settings["max_seq_length"]
    positions = finetuned.config.max_position_embeddings
    if not 8 <= max_seq_length <= positions:
        raise UserError(f"max_seq_length={max_seq_length} must be from 8 to the model's {positions} positions")
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size} must be at least 1")
    extra = {"null_threshold": null_threshold} if finetuned.head == "question_answering" else {}
    head = HEADS[finetuned.head](finetuned, max_seq_length, **extra)
    units = head.encode(records)
    outputs = run(head, units, batch_size, torch.device(device), progress)
    # Units come in the records' order (QA: the windows of each question in turn), whatever order they ran in.
    predictions = head.decode(records, units, outputs)
    predictions = [_ids(fields) | p for (_, fields), p in zip(records, predictions, strict=True)]
    tokens = sum(u.tokens for u in units)
    return Predicted(predictions, len(units), tokens, time.perf_counter() - started), head


def _ids(fields: dict) -> dict:
    """What names a record (`id`, GLUE's `idx`), copied to its prediction."""
    return {k: fields[k] for k in ("id", "idx") if k in fields}


def predict_to_file(cfg: DictConfig) -> Predicted:
    """What `src/predict.py` runs."""
    from lightbert.embeddings import pick_device

    output_file = str(cfg.output_file)
    if output_file != "-" and Path(output_file).expanduser().exists() and not cfg.overwrite:
        raise UserError(f"output_file={output_file} exists; choose another name or pass overwrite=true")
    device = pick_device(str(cfg.device))
    records, input_format = read_records(str(cfg.input_file), str(cfg.input_format))
    finetuned = load_finetuned(str(cfg.init_from))
    head_class = HEADS[finetuned.head]
    if input_format == "text" and not head_class.plain_text:
        raise UserError(
            f"input_file={cfg.input_file} holds plain text lines, and init_from is {finetuned.describe()}, which "
            f"reads JSON lines: {head_class.reads}"
        )
    say(f"predicting {len(records)} record(s) with {finetuned.describe()} from {finetuned.source}")
    predicted, head = predict_records(
        finetuned,
        records,
        batch_size=int(cfg.batch_size),
        max_seq_length=cfg.max_seq_length,
        device=device,
        null_threshold=cfg.null_score_diff_threshold,
        progress=True,
    )
    for note in head.notes:
        say(note)
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predicted.predictions)
    if output_file == "-":
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        with open_atomically(Path(output_file).expanduser()) as f:  # renamed into place when complete
            f.write(lines)
    rate = len(records) / predicted.seconds if predicted.seconds > 0 else math.inf
    say(
        f"predicted {len(records)} record(s) ({predicted.units} sequence(s), {predicted.tokens} tokens) in "
        f"{predicted.seconds:.1f}s: {rate:.1f} records/s on {device.type}; wrote {output_file}"
    )
    return predicted
