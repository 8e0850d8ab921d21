"""From start/end logits per window to one answer per SQuAD question, as the reference `write_predictions` does.

For each question, over all its windows: the `n_best_size` highest start and end logits of each window are
paired; a pair is a candidate when both ends lie in the context, the start is a token this window gives its most
context, end >= start and the span is at most `max_answer_length` tokens. Candidates are ranked by start + end
logit and the best `n_best_size` distinct texts kept, with softmax probabilities. v2.0 adds the null answer: its
score is the lowest [CLS] start + end logit over the windows, and the question is answered "" when

    null odds = null score - (start + end logit of the best non-null span)  >  threshold,

the threshold being `null_score_diff_threshold` or, when that is null, the one that maximises F1 on the evaluated
split (the official script's `best_f1_thresh`). Differences from the reference: the top logits are taken over a
window's real tokens (not its padding); the text is cut from the context by character offsets; a question with no
candidate at all is answered "" (the reference writes "empty").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from lightbert.files import write_atomically
from lightbert.tasks.finetuning.predictions import Predictions
from lightbert.tasks.squad.official_eval import best_threshold, evaluate_v1, evaluate_v2, raw_scores_v2

NO_CANDIDATE_ODDS = 1e9  # null odds of a question without any valid span: "" whatever the threshold


@dataclass
class Answer:
    """One question's n-best list (best first), its best non-null text and (v2.0) its null odds."""

    id: str
    text: str
    null_odds: float
    nbest: list[dict]
    start: int | None = None  # the best non-null span's characters in the context, [start, end)
    end: int | None = None


@dataclass
class Window:
    example: int
    offsets: np.ndarray  # (T, 2) character span of each token in the context; -1 outside it
    max_context: np.ndarray  # (T,) bool


def _top(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first (ties: lower index first, like a stable sort)."""
    order = np.argsort(-logits, kind="stable")
    return order[:k]


class SquadAnswers:
    """Post-processing and scoring of one evaluated split, given its examples and their evaluation windows."""

    def __init__(
        self,
        examples: datasets.Dataset,
        windows: datasets.Dataset,
        version_2: bool,
        n_best_size: int = 20,
        max_answer_length: int = 30,
        null_score_diff_threshold: float | None = None,
    ):
        self.ids: list[str] = examples["id"]
        self.contexts: list[str] = examples["context"]
        self.golds: dict[str, list[str]] = {i: a["text"] for i, a in zip(self.ids, examples["answers"], strict=True)}
        self.version_2 = version_2
        self.n_best_size, self.max_answer_length = n_best_size, max_answer_length
        self.null_score_diff_threshold = null_score_diff_threshold
        columns = windows.select_columns(["example_idx", "offsets", "max_context"]).with_format("numpy")
        self.windows = [
            Window(int(row["example_idx"]), np.asarray(row["offsets"]).reshape(-1, 2), row["max_context"].astype(bool))
            for row in columns
        ]
        self.windows_of: list[list[int]] = [[] for _ in self.ids]
        for index, window in enumerate(self.windows):
            self.windows_of[window.example].append(index)

    # -- logits -> n-best --------------------------------------------------------------------------------------

    def answer(self, example: int, logits: Mapping[int, np.ndarray]) -> Answer:
        """`logits[f]` is window f's (T, 2) start/end logits; padding beyond the window's length is ignored."""
        context = self.contexts[example]
        candidates = []  # (score, start logit, end logit, char start, char end)
        null = None  # (score, start logit, end logit) of the window with the lowest null score
        for f in self.windows_of[example]:
            if f not in logits:
                continue
            window = self.windows[f]
            start_logits, end_logits = (np.asarray(x, dtype=np.float64) for x in logits[f][: len(window.offsets)].T)
            if self.version_2:
                score = start_logits[0] + end_logits[0]
                if null is None or score < null[0]:
                    null = (score, start_logits[0], end_logits[0])
            in_context = window.offsets[:, 0] >= 0
            for s in _top(start_logits, self.n_best_size):
                if not (in_context[s] and window.max_context[s]):
                    continue
                for e in _top(end_logits, self.n_best_size):
                    if not in_context[e] or e < s or e - s + 1 > self.max_answer_length:
                        continue
                    score = start_logits[s] + end_logits[e]
                    candidates.append(
                        (score, start_logits[s], end_logits[e], window.offsets[s, 0], window.offsets[e, 1])
                    )
        if null is not None:  # v2.0: the null answer competes with the spans ([CLS] to [CLS])
            candidates.append((null[0], null[1], null[2], None, None))
        candidates.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for _, start_logit, end_logit, char_start, char_end in candidates:
            text = context[char_start:char_end] if char_start is not None else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": float(start_logit), "end_logit": float(end_logit)})
            if len(nbest) == self.n_best_size:
                break
        if null is not None and "" not in seen:  # the null answer is always listed, last if it ranks lower
            nbest.append({"text": "", "start_logit": float(null[1]), "end_logit": float(null[2])})
        best = next((c for c in candidates if c[3] is not None), None)  # the best non-null span
        best_text = context[best[3] : best[4]] if best else ""
        null_odds = float(null[0] - best[0]) if null is not None and best is not None else NO_CANDIDATE_ODDS
        _add_probabilities(nbest)
        span = (int(best[3]), int(best[4])) if best else (None, None)
        return Answer(self.ids[example], best_text, null_odds, nbest, *span)

    def answers(self, logits: Mapping[int, np.ndarray]) -> list[Answer]:
        return [self.answer(example, logits) for example in range(len(self.ids))]

    # -- n-best -> predictions -> scores -----------------------------------------------------------------------

    def threshold(self, answers: list[Answer]) -> float | None:
        """v2.0's null-odds threshold: the configured one, else the F1-best on this split.

        The F1-best is the official `best_f1_thresh` moved halfway to the next higher odds: the same predictions.
        """
        if not self.version_2:
            return None
        if self.null_score_diff_threshold is not None:
            return float(self.null_score_diff_threshold)
        texts = {a.id: a.text for a in answers}
        odds = {a.id: a.null_odds for a in answers}
        _, f1 = raw_scores_v2(self.golds, texts)
        has_answer = {qid: bool(gold) for qid, gold in self.golds.items()}
        _, threshold, improved = best_threshold(texts, f1, odds, has_answer)
        # Where no threshold beats "no answer everywhere", the official 0.0 would still answer some: go below all.
        if not improved:
            return min(odds.values()) - 1.0
        # The official threshold is one question's own odds, so that question sits on the boundary and float noise
        # of 1e-6 (another batch size, another machine) flips it. Halfway to the next higher odds (at most 1 above)
        # makes the same predictions on this split, hence the same F1, and keeps every question off the boundary.
        next_up = min([value for value in odds.values() if value > threshold] + [threshold + 2.0])
        return (threshold + next_up) / 2

    def predictions(self, answers: list[Answer], threshold: float | None) -> dict[str, str]:
        if threshold is None:
            return {a.id: a.text for a in answers}
        return {a.id: "" if a.null_odds > threshold else a.text for a in answers}

    def score(
        self, logits: Mapping[int, np.ndarray], with_odds: bool = False
    ) -> tuple[dict[str, float], list[Answer], dict[str, str]]:
        """The official scores of the split's predictions, the answers and the predictions.

        v2.0 scores include `null_threshold`; `with_odds` adds the best_* values of the official script given the
        null odds (what `squad_eval DATA predictions.json -n null_odds.json -t <null_threshold>` prints).
        """
        answers = self.answers(logits)
        threshold = self.threshold(answers)
        predictions = self.predictions(answers, threshold)
        if not self.version_2:
            return evaluate_v1(self.golds, predictions), answers, predictions
        if with_odds:  # scored as the official script does with the null odds and this threshold
            odds = {a.id: a.null_odds for a in answers}
            scores = evaluate_v2(self.golds, predictions, odds, threshold)
        else:  # the predictions as they stand ("" already where the odds exceed the threshold)
            scores = evaluate_v2(self.golds, predictions)
        scores["null_threshold"] = threshold
        return scores, answers, predictions

    def write(self, predictions: Predictions, out_dir: Path) -> list[Path]:
        """The official output files of the split's logits (`predictions`, keyed by split: this one only),
        written atomically, and eval.json with the official scores. SQuAD's `PredictionWriter`."""
        (logits,) = predictions.values()
        scores, answers, texts = self.score(logits, with_odds=True)
        files = {"predictions.json": texts, "nbest_predictions.json": {a.id: a.nbest for a in answers}}
        if self.version_2:
            files["null_odds.json"] = {a.id: a.null_odds for a in answers}
        files["eval.json"] = scores
        written = [
            write_atomically(out_dir / name, json.dumps(content, indent=2, ensure_ascii=False) + "\n")
            for name, content in files.items()
        ]
        shown = ", ".join(f"{k}={v:.2f}" for k, v in scores.items() if k in ("exact_match", "exact", "f1", "best_f1"))
        print(f"lightbert: SQuAD v{'2.0' if self.version_2 else '1.1'} dev predictions in {out_dir} ({shown})")
        return written


def _add_probabilities(nbest: list[dict]) -> None:
    """Softmax over the n-best total scores, as in the reference's `nbest_predictions.json`."""
    if not nbest:
        return
    scores = [c["start_logit"] + c["end_logit"] for c in nbest]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    for candidate, weight in zip(nbest, weights, strict=True):
        candidate["probability"] = weight / total
