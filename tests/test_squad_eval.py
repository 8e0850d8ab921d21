"""The SQuAD scorer against the official algorithm: crafted cases worked out by hand, torchmetrics where it agrees,
brute force for the best threshold, and the command line."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch
from torchmetrics.text import SQuAD

from lightbert.tasks.squad.official_eval import (
    best_threshold,
    evaluate_v1,
    evaluate_v2,
    f1_v1,
    f1_v2,
    normalize_answer,
    raw_scores_v2,
)


def test_normalisation_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("an apple a day, the end.") == "apple day end"
    assert normalize_answer("Theatre") == "theatre"  # "the" only as a word
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("the") == ""


def test_v1_takes_the_best_of_several_gold_answers():
    golds = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["the quick brown fox"], "q3": ["1895", "in 1895"]}
    predictions = {"q1": "the Denver Broncos.", "q2": "quick brown", "q3": "in 1895 or 1896"}
    scores = evaluate_v1(golds, predictions)
    # q1 exact; q2: precision 1, recall 2/3 -> F1 0.8; q3: best gold "in 1895": P 2/4, R 2/2 -> 2/3.
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 0.8 + 2 / 3) / 3)


def test_token_f1_counts_repeated_tokens_once_per_match():
    assert f1_v1("x b b", "b b c") == pytest.approx(2 / 3)  # common {b: 2}: P 2/3, R 2/3
    assert f1_v1("a b b", "b b c") == pytest.approx(0.8)  # "a" is an article: P 1, R 2/3
    assert f1_v1("x", "y") == 0.0


def test_v1_and_v2_differ_only_where_one_side_is_empty():
    assert f1_v1("", "") == 0.0 and f1_v2("", "") == 1.0
    assert f1_v1("the", "a") == 0.0 and f1_v2("the", "a") == 1.0  # both normalise to nothing
    assert f1_v1("", "paris") == f1_v2("", "paris") == 0.0
    assert f1_v1("in paris", "paris") == f1_v2("in paris", "paris")


def test_missing_predictions_score_zero_and_count_in_the_total():
    golds = {"q1": ["a cat"], "q2": ["dog"]}
    assert evaluate_v1(golds, {"q1": "cat"}) == {"exact_match": 50.0, "f1": 50.0}
    assert evaluate_v2(golds, {"q1": "cat"})["exact"] == 50.0


PHRASES = ["the cat", "a black cat", "cat", "dog", "the dog barked", "Paris", "in Paris, France", "1895", "U.S."]


def random_cases(n: int, seed: int, unanswerable: bool = False) -> tuple[dict, dict]:
    rng = random.Random(seed)
    golds, predictions = {}, {}
    for i in range(n):
        qid = f"q{i}"
        golds[qid] = [] if unanswerable and rng.random() < 0.3 else rng.sample(PHRASES, rng.randint(1, 3))
        predictions[qid] = rng.choice([*PHRASES, "", "cat dog"])
    return golds, predictions


def test_v1_equals_torchmetrics_squad_where_gold_answers_are_not_empty_after_normalising():
    golds, predictions = random_cases(300, seed=0)
    metric = SQuAD()
    metric.update(
        [{"prediction_text": p, "id": q} for q, p in predictions.items()],
        [{"answers": {"answer_start": [0] * len(g), "text": g}, "id": q} for q, g in golds.items()],
    )
    reference = {k: float(v) for k, v in metric.compute().items()}
    ours = evaluate_v1(golds, predictions)
    assert ours["exact_match"] == pytest.approx(reference["exact_match"], abs=1e-4)
    assert ours["f1"] == pytest.approx(reference["f1"], abs=1e-4)
    assert torch.is_tensor(metric.compute()["f1"])


def test_v2_unanswerable_questions_are_right_only_with_the_empty_answer():
    golds = {"has": ["Paris"], "none1": [], "none2": [], "gold_is_article": ["the"]}
    predictions = {"has": "paris", "none1": "", "none2": "London", "gold_is_article": ""}
    scores = evaluate_v2(golds, predictions)
    # "the" normalises to nothing, so "" is its right answer too (the official v2.0 rule).
    assert scores["exact"] == 75.0 and scores["f1"] == 75.0 and scores["total"] == 4
    assert scores["HasAns_exact"] == 100.0 and scores["HasAns_total"] == 2
    assert scores["NoAns_exact"] == 50.0 and scores["NoAns_total"] == 2


def test_v2_null_odds_above_the_threshold_mean_no_answer():
    golds = {"has": ["Paris"], "none": []}
    predictions = {"has": "Paris", "none": "London"}
    odds = {"has": -3.0, "none": 2.0}
    assert evaluate_v2(golds, predictions, odds, na_prob_thresh=1.0)["exact"] == 100.0
    assert evaluate_v2(golds, predictions, odds, na_prob_thresh=5.0)["exact"] == 50.0
    assert evaluate_v2(golds, predictions, odds, na_prob_thresh=-5.0)["exact"] == 50.0


def test_best_threshold_by_hand():
    # Sorted by odds: a (has, F1 1) -0.5, b (none, answered) 0.1, c (has, F1 0.5) 0.3.
    golds = {"a": ["x"], "b": [], "c": ["y z"]}
    predictions = {"a": "x", "b": "w", "c": "y"}
    odds = {"a": -0.5, "b": 0.1, "c": 0.3}
    scores = evaluate_v2(golds, predictions, odds)
    # All null: 1 (b). Answer a: 2. Answer b: 1. Answer c: 1 + 2/3.  Best 2/3 at threshold -0.5.
    assert scores["best_f1"] == pytest.approx(200 / 3) and scores["best_f1_thresh"] == -0.5
    assert scores["best_exact"] == pytest.approx(200 / 3) and scores["best_exact_thresh"] == -0.5


def test_best_threshold_is_the_best_over_every_threshold_by_brute_force():
    seen = set()
    for seed in range(12):
        golds, predictions = random_cases(60, seed=seed, unanswerable=True)
        rng = random.Random(seed)
        odds = {q: rng.uniform(-5, 5) for q in golds}
        has_answer = {q: bool(g) for q, g in golds.items()}
        _, f1_raw = raw_scores_v2(golds, predictions)
        best, threshold, improved = best_threshold(predictions, f1_raw, odds, has_answer)
        below_all = min(odds.values()) - 1  # no answer anywhere
        brute = max(evaluate_v2(golds, predictions, odds, t)["f1"] for t in [below_all, *odds.values()])
        assert best == pytest.approx(brute)
        # The official script reports 0.0 where nothing beats no-answer-everywhere; the flag says so.
        achieved_at = threshold if improved else below_all
        assert evaluate_v2(golds, predictions, odds, achieved_at)["f1"] == pytest.approx(best)
        seen.add(improved)
    assert seen == {True, False}  # both cases met


# -- the command line ------------------------------------------------------------------------------------------


def official_file(path, questions: dict[str, list[str]], version: str) -> str:
    qas = [
        {"id": q, "question": "?", "answers": [{"text": a, "answer_start": 0} for a in answers]}
        for q, answers in questions.items()
    ]
    if version.startswith("v2"):
        for qa in qas:
            qa["is_impossible"] = not qa["answers"]
    data = {"version": version, "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}
    path.write_text(json.dumps(data))
    return str(path)


def squad_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lightbert.tasks.squad.official_eval", *args], capture_output=True, text=True
    )


def test_cli_scores_a_v1_file_and_reports_missing_and_unknown_ids(tmp_path):
    data = official_file(tmp_path / "dev.json", {"q1": ["Paris"], "q2": ["dog"], "q3": ["x"]}, "1.1")
    (tmp_path / "pred.json").write_text(json.dumps({"q1": "paris", "q2": "a dog", "other": "y"}))
    run = squad_eval(data, str(tmp_path / "pred.json"))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == pytest.approx({"exact_match": 200 / 3, "f1": 200 / 3})
    assert "1 question(s) have no prediction and score 0" in run.stderr and "q3" in run.stderr
    assert "1 prediction(s) are for ids not in the data" in run.stderr


def test_cli_scores_a_v2_file_with_null_odds(tmp_path):
    data = official_file(tmp_path / "dev.json", {"q1": ["Paris"], "q2": []}, "v2.0")
    (tmp_path / "pred.json").write_text(json.dumps({"q1": "Paris", "q2": "London"}))
    (tmp_path / "odds.json").write_text(json.dumps({"q1": -1.0, "q2": 3.0}))
    run = squad_eval(data, str(tmp_path / "pred.json"), "-n", str(tmp_path / "odds.json"), "-o", str(tmp_path / "o"))
    assert run.returncode == 0, run.stderr
    scores = json.loads(run.stdout)
    assert scores["exact"] == 100.0 and scores["HasAns_total"] == 1 and scores["NoAns_total"] == 1
    assert scores["best_f1"] == 100.0 and scores["best_f1_thresh"] == -1.0
    assert json.loads((tmp_path / "o").read_text()) == scores


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "is not valid JSON"),
        ('["a list"]', "must be one JSON object"),
    ],
)
def test_cli_bad_prediction_files_get_one_clear_error(tmp_path, content, message):
    data = official_file(tmp_path / "dev.json", {"q1": ["Paris"]}, "1.1")
    if content is not None:
        (tmp_path / "pred.json").write_text(content)
    run = squad_eval(data, str(tmp_path / "pred.json"))
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


def test_cli_refuses_a_data_file_that_is_not_official_squad(tmp_path):
    (tmp_path / "dev.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "pred.json").write_text("{}")
    run = squad_eval(str(tmp_path / "dev.json"), str(tmp_path / "pred.json"))
    assert run.returncode == 2 and 'needs a top-level "data" list' in run.stderr
