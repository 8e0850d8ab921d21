"""The official SQuAD scorers, v1.1 and v2.0, as one module:
`python -m lightbert.tasks.squad.official_eval DATA.json PRED.json`.

Same algorithm as the official `evaluate-v1.1.py` and `evaluate-v2.0.py` (Rajpurkar et al.): answers are
lower-cased, stripped of punctuation, the articles a/an/the and extra whitespace; exact match and token F1
take the maximum over the gold answers. v2.0 adds: a question with no gold answer is answered correctly only by
the empty string; HasAns/NoAns breakdowns; with a null-odds file, no-answer where the odds exceed
`--na-prob-thresh`, and the best exact/F1 over all thresholds (`best_f1_thresh`, what a v2.0 run tunes).

Where this differs from the official scripts, on purpose:
- a question without a prediction scores 0 and counts in every total (v1.1 does this; v2.0 leaves it out of the
  overall total and crashes on the HasAns/NoAns ones); their number is reported, with a few ids;
- predictions for ids the data does not hold are ignored and reported.

torchmetrics' `SQuAD` is not used: it scores a gold answer that normalises to nothing ("the") as v2.0 does,
which differs from v1.1, and has no HasAns/NoAns breakdown or thresholds.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lightbert.errors import UserError, exits_on_user_error
from lightbert.files import write_atomically

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, articles and extra whitespace (the official order of steps)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_v1(prediction: str, gold: str) -> float:
    """v1.1's token F1: no overlap (which includes an empty side) scores 0."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    return _overlap_f1(pred_tokens, gold_tokens)


def f1_v2(prediction: str, gold: str) -> float:
    """v2.0's token F1: if either side is empty, 1 when both are, else 0."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return _overlap_f1(pred_tokens, gold_tokens)


def _overlap_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@dataclass
class Coverage:
    """Which questions the predictions answer: missing ones score 0, unknown ones are ignored."""

    missing: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        lines = []
        if self.missing:
            lines.append(f"{len(self.missing)} question(s) have no prediction and score 0, e.g. {self.missing[:3]}")
        if self.unknown:
            lines.append(f"{len(self.unknown)} prediction(s) are for ids not in the data, ignored: {self.unknown[:3]}")
        return lines


def coverage(golds: Mapping[str, list[str]], predictions: Mapping[str, str]) -> Coverage:
    return Coverage(
        missing=[qid for qid in golds if qid not in predictions],
        unknown=[qid for qid in predictions if qid not in golds],
    )


def evaluate_v1(golds: Mapping[str, list[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """`evaluate-v1.1.py`: {"exact_match", "f1"} in percent over every question in `golds` (id -> answers)."""
    exact = f1 = 0.0
    for qid, answers in golds.items():
        if not answers:
            raise UserError(f"question {qid} has no gold answer, which v1.1 cannot score; score the file as v2.0")
        if qid not in predictions:
            continue
        exact += max(exact_match(predictions[qid], a) for a in answers)
        f1 += max(f1_v1(predictions[qid], a) for a in answers)
    total = len(golds)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def raw_scores_v2(
    golds: Mapping[str, list[str]], predictions: Mapping[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-question exact and F1 before any no-answer threshold (`get_raw_scores`); missing predictions score 0."""
    exact, f1 = {}, {}
    for qid, answers in golds.items():
        gold = [a for a in answers if normalize_answer(a)] or [""]  # unanswerable: only "" is right
        prediction = predictions.get(qid)
        if prediction is None:
            exact[qid] = f1[qid] = 0.0
            continue
        exact[qid] = max(exact_match(prediction, a) for a in gold)
        f1[qid] = max(f1_v2(prediction, a) for a in gold)
    return exact, f1


def _apply_threshold(
    scores: dict[str, float], na_probs: Mapping[str, float], has_answer: dict[str, bool], threshold: float
) -> dict[str, float]:
    # The question counts as answered "no answer" where its odds exceed the threshold.
    return {
        qid: float(not has_answer[qid]) if na_probs.get(qid, 0.0) > threshold else score
        for qid, score in scores.items()
    }


def best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float, bool]:
    """`find_best_thresh`: answer the questions in order of rising null odds; keep the best running score.

    Returns (best score in percent, its threshold, whether any threshold beats answering nothing). Starting from
    "no answer everywhere" (all unanswerable ones right), answering a question adds its score, or loses the point
    of an unanswerable one it answers with text. The official script reports 0.0 as the threshold when nothing
    beats no-answer-everywhere; the flag tells a caller who wants to reproduce that choice.
    """
    score = best = sum(1 for qid, has in has_answer.items() if not has and qid in predictions)
    threshold, improved = 0.0, False
    for qid in sorted((q for q in na_probs if q in scores), key=lambda q: na_probs[q]):
        if has_answer[qid]:
            score += scores[qid]
        elif predictions.get(qid):
            score -= 1
        if score > best:
            best, threshold, improved = score, na_probs[qid], True
    return 100.0 * best / len(scores), threshold, improved


def evaluate_v2(
    golds: Mapping[str, list[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """`evaluate-v2.0.py`: exact/f1/total, HasAns_* and NoAns_*, and with null odds the best_* thresholds."""
    has_answer = {qid: bool(answers) for qid, answers in golds.items()}
    exact_raw, f1_raw = raw_scores_v2(golds, predictions)
    odds = na_probs if na_probs is not None else {}
    exact = _apply_threshold(exact_raw, odds, has_answer, na_prob_thresh)
    f1 = _apply_threshold(f1_raw, odds, has_answer, na_prob_thresh)
    result: dict[str, float] = {}
    for prefix, qids in (
        ("", list(golds)),
        ("HasAns_", [q for q, has in has_answer.items() if has]),
        ("NoAns_", [q for q, has in has_answer.items() if not has]),
    ):
        if qids:
            result[prefix + "exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
            result[prefix + "f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            result[prefix + "total"] = len(qids)
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"], _ = best_threshold(predictions, exact_raw, odds, has_answer)
        result["best_f1"], result["best_f1_thresh"], _ = best_threshold(predictions, f1_raw, odds, has_answer)
    return result


# -- files -------------------------------------------------------------------------------------------------


@dataclass
class SquadData:
    """An official-format data file: gold answer texts per question id, and whether it is v2.0."""

    golds: dict[str, list[str]]
    version_2: bool


def read_official(path: str | Path) -> SquadData:
    """Read `{"version", "data": [{"paragraphs": [{"context", "qas": [{"id", "answers": [...]}]}]}]}`."""
    dataset = _read_json(path, "data file")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
        raise UserError(f'{path} is not an official SQuAD file: it needs a top-level "data" list of articles')
    golds: dict[str, list[str]] = {}
    impossible = False
    try:
        for article in dataset["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    golds[str(qa["id"])] = [a["text"] for a in qa["answers"]]
                    impossible |= bool(qa.get("is_impossible", False))
    except (KeyError, TypeError) as error:
        expected = "data -> paragraphs -> qas -> id/answers"
        raise UserError(f"{path}: an article lacks {error} (expected {expected})") from None
    if not golds:
        raise UserError(f"{path} holds no questions")
    version = str(dataset.get("version", ""))
    return SquadData(golds, version_2=impossible or version.lstrip("v").startswith("2"))


def _read_json(path: str | Path, what: str) -> object:
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"{what} {file} does not exist")
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{what} {file} is not valid JSON: {error}") from None


def _read_mapping(path: str | Path, what: str, value_type: type | tuple[type, ...]) -> dict:
    mapping = _read_json(path, what)
    if not isinstance(mapping, dict) or not all(isinstance(v, value_type) for v in mapping.values()):
        raise UserError(f"{what} {path} must be one JSON object mapping question id -> {value_type}")
    return mapping


def score_files(
    data_file: str | Path,
    prediction_file: str | Path,
    na_prob_file: str | Path | None = None,
    na_prob_thresh: float = 1.0,
    version_2: bool | None = None,
) -> tuple[dict[str, float], Coverage]:
    data = read_official(data_file)
    predictions = _read_mapping(prediction_file, "predictions file", str)
    na_probs = _read_mapping(na_prob_file, "null-odds file", (int, float)) if na_prob_file else None
    is_v2 = data.version_2 if version_2 is None else version_2
    if is_v2:
        scores = evaluate_v2(data.golds, predictions, na_probs, na_prob_thresh)
    else:
        scores = evaluate_v1(data.golds, predictions)
    return scores, coverage(data.golds, predictions)


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightbert.tasks.squad.official_eval",
        description="Score SQuAD predictions as the official v1.1/v2.0 scripts.",
    )
    parser.add_argument("data_file", help="official-format data file (dev-v1.1.json, dev-v2.0.json)")
    parser.add_argument("prediction_file", help="predictions.json: question id -> answer text")
    parser.add_argument("--na-prob-file", "-n", help="v2.0: null_odds.json, question id -> no-answer odds")
    parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0, help="v2.0: no answer above these odds")
    parser.add_argument("--version", choices=["1.1", "2.0"], help="scorer to use (default: from the data file)")
    parser.add_argument("--out-file", "-o", help="write the scores here as JSON as well")
    args = parser.parse_args(argv)
    version_2 = None if args.version is None else args.version == "2.0"
    scores, covered = score_files(
        args.data_file, args.prediction_file, args.na_prob_file, args.na_prob_thresh, version_2
    )
    for line in covered.warnings():
        print(f"warning: {line}", file=sys.stderr)
    text = json.dumps(scores, indent=2)
    print(text)
    if args.out_file:
        write_atomically(Path(args.out_file), text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
