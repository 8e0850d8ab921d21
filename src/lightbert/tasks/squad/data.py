"""SQuAD v1.1 and v2.0 (Rajpurkar et al. 2016, 2018) for fine-tuning: examples, sliding windows, batches.

Data comes from the hub (`rajpurkar/squad`, `rajpurkar/squad_v2`), from local files with the hub's columns (`id`,
`title`, `context`, `question`, `answers: {text: [...], answer_start: [...]}`) in json, jsonl or parquet, or from
the official nested JSON files (`data -> paragraphs -> qas`), one per split: `task.data_files.<split>=PATH`.

Windows follow the reference `run_squad.py`: `[CLS] question [SEP] window of the context [SEP]`, the question cut
to `max_query_length` tokens, windows `doc_stride` tokens apart, each token marked when this window gives it its
most context. A training window is labelled with the answer's first and last token, or with [CLS] (position 0)
when it does not hold the whole answer or the question has none (v2.0). Differences from the reference:

- Answers map from characters to tokens through the tokenizer's offsets (as Hugging Face's `run_qa` does), not
  through whitespace words and `_improve_answer_span`; answer text is cut from the context by the same offsets.
- Bad input is counted and reported rather than fatal: an `answer_start` that does not point at the answer text
  moves to the nearest occurrence of that text (or the question is dropped from training if there is none); an
  empty context gives no windows (dropped from training, answered "" in evaluation); a question longer than
  `max_query_length` is cut, as the reference cuts it silently.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import datasets
import torch

from lightbert.data.batches import PaddingCollator
from lightbert.data.encoding import encode_pair
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import ParameterError, UserError
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule
from lightbert.tasks.squad.answers import SquadAnswers

log = logging.getLogger(__name__)

VERSIONS = ("1.1", "2.0")
HUB_DATASETS = {"1.1": "rajpurkar/squad", "2.0": "rajpurkar/squad_v2"}
COLUMNS = ("id", "context", "question", "answers")
ENCODE_CHUNK = 1000  # examples tokenised per call to the Rust tokenizer


# -- reading -----------------------------------------------------------------------------------------------


def _position(value: object, question: object, where: str) -> int:
    """An `answer_start`: a character position (an integer, or digits)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**63:
        raise UserError(
            f"{where}: question {question}: answer_start {value!r} is not a character position of the context "
            "(a whole number from 0)"
        )
    return value


def check_rows(raw: datasets.Dataset, where: str) -> None:
    """Each question has text, a context, and answers as {text: [...], answer_start: [...]} of one length; named by
    its id when not (a null field, a flat file's empty answer_start)."""
    for question_id, context, question, answers in zip(
        raw["id"], raw["context"], raw["question"], raw["answers"], strict=True
    ):
        for name, value in (("context", context), ("question", question)):
            if not isinstance(value, str):
                raise UserError(f"{where}: question {question_id}: {name} is {value!r}, not text")
        if not isinstance(answers, dict) or not isinstance(answers.get("text"), list):
            raise UserError(
                f"{where}: question {question_id}: answers must be {{text: [...], answer_start: [...]}}, "
                f"not {answers!r}"
            )
        starts = answers.get("answer_start")
        if not isinstance(starts, list) or len(starts) != len(answers["text"]):
            raise UserError(
                f"{where}: question {question_id}: answers has {len(answers['text'])} text(s) and answer_start "
                f"{starts!r}; give one answer_start per text"
            )
        for start in starts:
            _position(start, question_id, where)


def flatten_official(dataset: dict, where: str) -> dict[str, list]:
    """The official nested JSON as the hub's flat columns, one row per question."""
    rows: dict[str, list] = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    try:
        for article in dataset["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    answers = qa.get("answers") or []
                    rows["id"].append(str(qa["id"]))
                    rows["title"].append(article.get("title", ""))
                    rows["context"].append(paragraph["context"])
                    rows["question"].append(qa["question"])
                    rows["answers"].append(
                        {
                            "text": [a["text"] for a in answers],
                            "answer_start": [_position(a["answer_start"], qa["id"], where) for a in answers],
                        }
                    )
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(
            f"{where}: a question lacks {error}; official SQuAD files hold data -> paragraphs -> "
            "{context, qas -> {id, question, answers -> {text, answer_start}}}"
        ) from None
    return rows


def read_official_file(file: Path, where: str) -> datasets.Dataset | None:
    """The file as an official SQuAD JSON ({"data": [...]}), or None if it is some other JSON (e.g. JSON lines)."""
    try:
        content = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(content, dict) or "data" not in content:
        return None
    return datasets.Dataset.from_dict(flatten_official(content, where))


# -- windows ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Windowing:
    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64

    def __post_init__(self) -> None:
        if self.max_query_length < 1 or self.doc_stride < 1:
            raise ParameterError(
                f"{{0}} ({self.max_query_length}) and {{1}} ({self.doc_stride}) must be >= 1",
                "max_query_length",
                "doc_stride",
            )
        if self.max_seq_length - self.max_query_length - 3 < 1:
            raise ParameterError(
                f"{{0}} ({self.max_seq_length}) leaves no room for the context after a question of "
                f"{{1}} ({self.max_query_length}) tokens and 3 special tokens; raise the first or lower the second",
                "max_seq_length",
                "max_query_length",
            )


def doc_windows(num_tokens: int, max_tokens: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_tokens` context tokens, as the reference's `doc_spans`."""
    windows, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        windows.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, stride)
    return windows


def max_context_flags(windows: list[tuple[int, int]], index: int) -> list[bool]:
    """For each token of window `index`: is this the window where it has the most context on both sides?

    The reference's `_check_is_max_context`: score = min(left, right context) + 0.01 * window length; the first
    window wins a tie. An answer may only start at such a token, so each token is judged in one window.
    """
    start, length = windows[index]
    # Only the neighbours that overlap this window can hold its tokens (window ends only grow): a long context's
    # thousands of windows cost linear time, not quadratic.
    first, last = index, index
    while first > 0 and sum(windows[first - 1]) > start:
        first -= 1
    while last + 1 < len(windows) and windows[last + 1][0] < start + length:
        last += 1
    flags = []
    for position in range(start, start + length):
        best_score, best = None, None
        for i in range(first, last + 1):
            s, n = windows[i]
            if not s <= position < s + n:
                continue
            score = min(position - s, s + n - 1 - position) + 0.01 * n
            if best_score is None or score > best_score:
                best_score, best = score, i
        flags.append(best == index)
    return flags


def locate_answer(context: str, text: str, answer_start: int) -> int | None:
    """Where `text` starts in `context`: at `answer_start` if it is there, else its nearest occurrence, else None."""
    if text and context[answer_start : answer_start + len(text)] == text:
        return answer_start
    occurrences, at = [], context.find(text) if text else -1
    while at >= 0:
        occurrences.append(at)
        at = context.find(text, at + 1)
    return min(occurrences, key=lambda o: abs(o - answer_start)) if occurrences else None


def token_span(offsets: list[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last token overlapping the characters [char_start, char_end), or None if no token does."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > char_start and s < char_end), None)
    if first is None:
        return None
    last = max(i for i, (s, e) in enumerate(offsets) if e > char_start and s < char_end)
    return first, last


@dataclass
class Problems:
    """Bad input met while building windows: per kind, how many examples and a few of their ids."""

    ids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    MESSAGES: ClassVar[dict[str, str]] = {
        "question_truncated": "questions longer than task.max_query_length tokens were cut to it",
        "empty_context": "examples have an empty context: no windows (left out of training, answered '' in evaluation)",
        "answer_realigned": "answers do not start at their answer_start; moved to the nearest occurrence of the text",
        "answer_not_found": "answer texts do not occur in their context; left out of training",
        "answer_missing": "v1.1 training questions have no answer; left out (use task=squad_v2 for unanswerable ones)",
    }

    def add(self, kind: str, example_id: str) -> None:
        self.ids[kind].append(example_id)

    def counts(self) -> dict[str, int]:
        return {kind: len(ids) for kind, ids in self.ids.items()}

    def lines(self, where: str) -> list[str]:
        return [
            f"{where}: {len(ids)} {self.MESSAGES[kind]} (e.g. ids {ids[:3]})" for kind, ids in sorted(self.ids.items())
        ]

    def as_json(self) -> dict[str, list[str]]:
        return {kind: list(ids) for kind, ids in sorted(self.ids.items())}


def _chunks(raw: datasets.Dataset) -> Iterator[tuple[int, dict[str, list]]]:
    for start in range(0, len(raw), ENCODE_CHUNK):
        yield start, raw[start : start + ENCODE_CHUNK]


def make_windows(
    raw: datasets.Dataset, tokenizer: BertTokenizer, windowing: Windowing, training: bool, version_2: bool
) -> tuple[dict[str, list], Problems]:
    """Every window of every example as a row, and the problems met.

    Every row holds `start_positions`/`end_positions`: the first answer's first and last token, or [CLS] (0) when
    the window does not hold the whole answer or there is none. Evaluation rows add what post-processing needs:
    the example they come from, each token's character offsets in the context (-1 outside it) and its
    max-context flag; their labels give the validation loss only, so an answer that is not found labels [CLS]
    there instead of dropping the question.
    """
    columns = ["input_ids", "token_type_ids", "start_positions", "end_positions"]
    columns += [] if training else ["example_idx", "offsets", "max_context"]
    rows: dict[str, list] = {c: [] for c in columns}
    problems = Problems()
    for first_index, chunk in _chunks(raw):
        questions = tokenizer.backend.encode_batch(chunk["question"], add_special_tokens=False)
        unique_contexts = list(dict.fromkeys(chunk["context"]))  # ~5 questions share each paragraph
        encoded = dict(
            zip(unique_contexts, tokenizer.backend.encode_batch(unique_contexts, add_special_tokens=False), strict=True)
        )
        for k, (example_id, context, answers, question) in enumerate(
            zip(chunk["id"], chunk["context"], chunk["answers"], questions, strict=True)
        ):
            query = question.ids
            if len(query) > windowing.max_query_length:
                problems.add("question_truncated", example_id)
                query = query[: windowing.max_query_length]
            # Read once: each access to an Encoding's ids or offsets builds a new list of the whole context.
            doc_ids, doc_offsets = encoded[context].ids, encoded[context].offsets
            if not doc_ids:
                problems.add("empty_context", example_id)
                continue
            # Evaluation keeps every question: its answer's problems are not training's to report.
            span = _answer_tokens(
                context, answers, doc_offsets, example_id, problems if training else Problems(), version_2
            )
            if span is False:
                if training:
                    continue
                span = None
            max_tokens = windowing.max_seq_length - len(query) - 3
            windows = doc_windows(len(doc_ids), max_tokens, windowing.doc_stride)
            for w, (start, length) in enumerate(windows):
                ids, types = encode_pair(query, doc_ids[start : start + length], tokenizer.cls_id, tokenizer.sep_id)
                rows["input_ids"].append(ids)
                rows["token_type_ids"].append(types)
                context_start = len(query) + 2  # [CLS] question [SEP]
                # [CLS] unless the whole answer lies in this window (and there is an answer).
                first, last = 0, 0
                if span is not None and start <= span[0] and span[1] < start + length:
                    first, last = span[0] - start + context_start, span[1] - start + context_start
                rows["start_positions"].append(first)
                rows["end_positions"].append(last)
                if not training:
                    outside = [(-1, -1)] * context_start
                    rows["example_idx"].append(first_index + k)
                    rows["offsets"].append([*outside, *doc_offsets[start : start + length], (-1, -1)])
                    flags = max_context_flags(windows, w)
                    rows["max_context"].append([False] * context_start + flags + [False])
    return rows, problems


def _answer_tokens(context: str, answers: dict, offsets: list, example_id: str, problems: Problems, version_2: bool):
    """The first answer's (first, last) context token; None for no answer (v2.0); False to drop the example."""
    if not answers["text"]:
        if version_2:
            return None
        problems.add("answer_missing", example_id)
        return False
    text, start = answers["text"][0], int(answers["answer_start"][0])
    located = locate_answer(context, text, start)
    if located is None:
        problems.add("answer_not_found", example_id)
        return False
    if located != start:
        problems.add("answer_realigned", example_id)
    span = token_span(offsets, located, located + len(text))
    if span is None:  # only whitespace: nothing to point at
        problems.add("answer_not_found", example_id)
        return False
    return span


# -- the DataModule ----------------------------------------------------------------------------------------


class SquadDataModule(FineTuningDataModule):
    """Windows cached once per (data, tokenizer, windowing); the dev set's examples kept for post-processing.

    SQuAD's test sets are hidden, so predictions are written for the dev set: `predictions.json`
    (and `null_odds.json` for v2.0) in the official format, scored by `lightbert.tasks.squad.official_eval`.
    """

    family = "squad"
    predicts_validation = True
    min_seq_length = 1  # Windowing checks the room left for the context

    def __init__(
        self,
        version: str,
        *,
        max_seq_length: int = 384,
        doc_stride: int = 128,
        max_query_length: int = 64,
        n_best_size: int = 20,
        max_answer_length: int = 30,
        null_score_diff_threshold: float | None = None,
        **shared,
    ):
        if str(version) not in VERSIONS:
            raise ParameterError(f"unknown SQuAD {{0}} {version!r}; valid: {list(VERSIONS)}", "version")
        self.version = str(version)
        self.name = f"squad_v{self.version[0]}"
        self.hub_dataset = HUB_DATASETS[self.version]
        if n_best_size < 1 or max_answer_length < 1:
            raise ParameterError(
                f"{{0}} ({n_best_size}) and {{1}} ({max_answer_length}) must be >= 1",
                "n_best_size",
                "max_answer_length",
            )
        self.windowing = Windowing(max_seq_length, doc_stride, max_query_length)
        self.n_best_size, self.max_answer_length = n_best_size, max_answer_length
        self.null_score_diff_threshold = null_score_diff_threshold
        self._problems: dict[str, dict[str, list[str]]] = {}
        super().__init__(max_seq_length=max_seq_length, **shared)

    @property
    def version_2(self) -> bool:
        return self.version == "2.0"

    def read_file(self, file: Path, where: str) -> datasets.Dataset:
        official = read_official_file(file, where) if file.suffix.lower() == ".json" else None
        return official if official is not None else super().read_file(file, where)

    def required_columns(self, split: str) -> tuple[str, ...]:
        return COLUMNS

    def check(self, raw: datasets.Dataset, split: str, where: str) -> datasets.Dataset:
        check_rows(raw, where)
        duplicated = [i for i, n in Counter(raw["id"]).items() if n > 1]
        if duplicated:
            raise UserError(f"{where}: question ids must be unique, these repeat: {duplicated[:5]}")
        if split != "train" and not self.version_2:
            unanswered = [i for i, a in zip(raw["id"], raw["answers"], strict=True) if not a["text"]]
            if unanswered:
                raise UserError(
                    f"{where}: {len(unanswered)} question(s) have no answer (e.g. {unanswered[:3]}), which SQuAD v1.1 "
                    "cannot score; for unanswerable questions use task=squad_v2"
                )
        return raw

    def cache_settings(self) -> list:
        return [self.windowing.max_seq_length, self.windowing.doc_stride, self.windowing.max_query_length]

    def encode(self, raw: datasets.Dataset, split: str, where: str) -> dict[str, datasets.Dataset]:
        training = split == "train"
        rows, found = make_windows(raw, self.tokenizer, self.windowing, training, self.version_2)
        if not rows["input_ids"]:
            why = "; ".join(line.split(": ", 1)[1] for line in found.lines(where)) or "the split holds no question"
            raise UserError(f"{where}: no question gave a window to {'train' if training else 'score'} on: {why}")
        windows = datasets.Dataset.from_dict(rows)
        self._problems[split] = found.as_json()
        parts = {split: windows.add_column("idx", list(range(len(windows))))}
        if not training:
            parts[f"{split}_examples"] = raw.select_columns(["id", "context", "answers"])
        return parts

    def cache_notes(self) -> dict[str, str]:
        return {**super().cache_notes(), "problems.json": json.dumps(self._problems, indent=1)}

    def on_encoded(self, cached_dir: Path) -> None:
        super().on_encoded(cached_dir)
        for split, by_kind in json.loads((cached_dir / "problems.json").read_text()).items():
            for line in Problems(defaultdict(list, by_kind)).lines(f"SQuAD {split}"):
                log.warning(line)

    @cached_property
    def validation_answers(self) -> SquadAnswers:
        """Post-processing of the dev set: model logits per window -> answer text per question, scored."""
        assert self.datasets is not None, "call setup() first"
        return SquadAnswers(
            self.datasets["validation_examples"],
            self.datasets["validation"],
            version_2=self.version_2,
            n_best_size=self.n_best_size,
            max_answer_length=self.max_answer_length,
            null_score_diff_threshold=self.null_score_diff_threshold,
        )

    def evaluator(self) -> SquadAnswers:
        return self.validation_answers

    def prediction_writer(self) -> SquadAnswers:
        return self.validation_answers

    def loader_columns(self, train: bool) -> list[str]:
        return ["input_ids", "token_type_ids", "start_positions", "end_positions", *(() if train else ("idx",))]

    def collator(self, train: bool) -> PaddingCollator:
        fields = ("start_positions", "end_positions", *(() if train else ("idx",)))
        return PaddingCollator(self.tokenizer.pad_id, {f: (f, torch.long) for f in fields}, self.pad_to_multiple_of)
