"""SQuAD: windows and answer spans, post-processing across windows, the head against transformers, end-to-end runs
on local files in the official and the hub's schema, and bad input."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import datasets
import numpy as np
import pytest
import torch
import transformers
from helpers.models import write_hf_bert
from helpers.runs import compose_config, run_train_forked
from helpers.squad_files import squad_articles, squad_data_files, write_flat, write_official

from lightbert import train
from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.data.tokenizer import load_tokenizer
from lightbert.errors import UserError
from lightbert.model import BertConfig, BertForQuestionAnswering
from lightbert.tasks.squad.answers import NO_CANDIDATE_ODDS, SquadAnswers
from lightbert.tasks.squad.data import (
    Windowing,
    doc_windows,
    locate_answer,
    make_windows,
    max_context_flags,
    read_official_file,
)
from lightbert.tasks.squad.module import QuestionAnsweringModule, span_loss
from lightbert.tasks.squad.official_eval import evaluate_v2


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("hf") / "bert")


@pytest.fixture(scope="module")
def tokenizer(hf_dir):
    return load_tokenizer(hf_dir / "vocab.txt")


def examples(rows: list[tuple[str, str, str, list[str], list[int]]]) -> datasets.Dataset:
    """(id, context, question, answer texts, answer starts) rows in the hub's columns."""
    return datasets.Dataset.from_dict(
        {
            "id": [r[0] for r in rows],
            "context": [r[1] for r in rows],
            "question": [r[2] for r in rows],
            "answers": [{"text": r[3], "answer_start": r[4]} for r in rows],
        }
    )


# -- windows ---------------------------------------------------------------------------------------------------


def test_windows_step_by_the_stride_and_end_at_the_last_token():
    assert doc_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert doc_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert doc_windows(3, 4, 2) == [(0, 3)]
    assert doc_windows(9, 4, 8) == [(0, 4), (4, 4), (8, 1)]  # the stride never skips tokens
    assert doc_windows(0, 4, 2) == []


def test_every_token_has_its_max_context_in_exactly_one_window():
    for n, size, stride in [(10, 4, 2), (37, 8, 3), (50, 16, 16), (5, 8, 2)]:
        windows = doc_windows(n, size, stride)
        owners = {}
        for w, (start, _) in enumerate(windows):
            for offset, flag in enumerate(max_context_flags(windows, w)):
                if flag:
                    assert start + offset not in owners
                    owners[start + offset] = w
        assert sorted(owners) == list(range(n))
    # Worked example, windows (0,4) (2,4) (4,4) (6,4): token 3 has 0 context on the right in window 0, and
    # min(1, 2) + 0.04 in window 1; token 2 ties between windows 0 and 1 (1 either side) so the first wins.
    windows = doc_windows(10, 4, 2)
    assert max_context_flags(windows, 0) == [True, True, True, False]
    assert max_context_flags(windows, 1) == [False, True, True, False]


def test_a_wrong_answer_start_moves_to_the_nearest_occurrence():
    context = "red car, blue car, red car"
    assert locate_answer(context, "red car", 0) == 0
    assert locate_answer(context, "red car", 17) == 19
    assert locate_answer(context, "red car", 3) == 0
    assert locate_answer(context, "green", 0) is None
    assert locate_answer(context, "", 0) is None


def test_answer_spans_round_trip_through_tokens_in_every_window(tokenizer):
    """Characters -> token labels in each window -> characters: the answer's text, or [CLS] where it does not fit."""
    words = [f"w{i % 7}" for i in range(60)]
    context = " ".join(words)
    windowing = Windowing(max_seq_length=24, doc_stride=5, max_query_length=4)
    for position in (0, 3, 18, 19, 20, 40, 59):  # start, middle, on and around window edges, the very end
        text = " ".join(words[position : position + 2])
        start = len(" ".join(words[:position])) + (1 if position else 0)
        raw = examples([("q", context, "w1", [text], [start])])  # at most 2 pieces: never cut
        train_rows, problems = make_windows(raw, tokenizer, windowing, training=True, version_2=False)
        eval_rows, _ = make_windows(raw, tokenizer, windowing, training=False, version_2=False)
        assert not problems.counts()
        assert len(train_rows["input_ids"]) == len(eval_rows["input_ids"]) > 1  # several windows
        found = 0
        for first, last, offsets, ids in zip(
            train_rows["start_positions"],
            train_rows["end_positions"],
            eval_rows["offsets"],
            eval_rows["input_ids"],
            strict=True,
        ):
            assert len(ids) <= windowing.max_seq_length
            if (first, last) == (0, 0):
                continue
            found += 1
            assert context[offsets[first][0] : offsets[last][1]] == text
        # Which windows hold the whole answer, counted in tokens (a word may be several tokens or one [UNK]).
        offsets = tokenizer.backend.encode(context, add_special_tokens=False).offsets
        first_token = next(i for i, (s, e) in enumerate(offsets) if e > start)
        last_token = max(i for i, (s, e) in enumerate(offsets) if s < start + len(text))
        room = windowing.max_seq_length - len(tokenizer.encode_batch(["w1"])[0]) - 3  # [CLS] q [SEP] ... [SEP]
        in_window = [s <= first_token and last_token < s + n for s, n in doc_windows(len(offsets), room, 5)]
        assert found == sum(in_window) >= 1  # labelled in every window that holds the whole answer


def test_features_are_cls_question_sep_context_sep_with_segments(tokenizer):
    raw = examples([("q", "the river of paris is blue", "what is the river", ["blue"], [22])])
    rows, _ = make_windows(raw, tokenizer, Windowing(64, 16, 8), training=True, version_2=False)
    ids, types = rows["input_ids"][0], rows["token_type_ids"][0]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    question = tokenizer.convert_ids_to_tokens(tokenizer.encode_batch(["what is the river"])[0])
    assert tokens[: len(question) + 2] == ["[CLS]", *question, "[SEP]"] and tokens[-1] == "[SEP]"
    assert types == [0] * (len(question) + 2) + [1] * (len(ids) - len(question) - 2)
    assert tokens[rows["start_positions"][0] : rows["end_positions"][0] + 1] == tokenizer.convert_ids_to_tokens(
        tokenizer.encode_batch(["blue"])[0]
    )


def test_unanswerable_questions_train_on_cls_in_every_window(tokenizer):
    raw = examples([("q", " ".join(["river"] * 50), "what", [], [])])
    rows, problems = make_windows(raw, tokenizer, Windowing(24, 8, 4), training=True, version_2=True)
    assert len(rows["input_ids"]) > 1 and set(rows["start_positions"]) == set(rows["end_positions"]) == {0}
    assert not problems.counts()


def test_bad_examples_are_counted_not_fatal(tokenizer):
    long_question = " ".join(["what"] * 20)
    raw = examples(
        [
            ("ok", "the river is blue", "what", ["blue"], [13]),
            ("shifted", "the river is blue", "what", ["blue"], [2]),
            ("absent", "the river is blue", "what", ["green"], [2]),
            ("empty", "", "what", ["blue"], [0]),
            ("long", "the river is blue", long_question, ["blue"], [13]),
            ("v1_without_answer", "the river is blue", "what", [], []),
        ]
    )
    rows, problems = make_windows(raw, tokenizer, Windowing(64, 16, 8), training=True, version_2=False)
    assert problems.counts() == {
        "answer_realigned": 1,
        "answer_not_found": 1,
        "empty_context": 1,
        "question_truncated": 1,
        "answer_missing": 1,
    }
    assert len(rows["input_ids"]) == 3  # ok, shifted (moved to 13), long (cut)
    blue = tokenizer.encode_batch(["blue"])[0]
    for ids, first, last in zip(rows["input_ids"], rows["start_positions"], rows["end_positions"], strict=True):
        assert ids[first : last + 1] == blue
    assert len(rows["input_ids"][2]) == 1 + 8 + 1 + len(tokenizer.encode_batch(["the river is blue"])[0]) + 1
    assert any("1 questions longer than task.max_query_length" in line for line in problems.lines("SQuAD train"))


def test_official_json_becomes_the_hub_columns(tmp_path):
    path = write_official(tmp_path / "dev.json", squad_articles(2, seed=0, unanswerable=True), "v2.0")
    raw = read_official_file(path, "dev")
    assert raw.column_names == ["id", "title", "context", "question", "answers"] and len(raw) == 8
    answered = raw[0]
    assert answered["context"][answered["answers"]["answer_start"][0] :].startswith(answered["answers"]["text"][0])
    assert raw[3]["answers"] == {"text": [], "answer_start": []}


# -- post-processing -------------------------------------------------------------------------------------------


def answers_for(tokenizer, context: str, question: str, windowing: Windowing, version_2: bool, **kwargs):
    raw = examples([("q", context, question, ["x"], [0])])
    rows, _ = make_windows(raw, tokenizer, windowing, training=False, version_2=version_2)
    features = datasets.Dataset.from_dict(rows)
    return SquadAnswers(raw, features, version_2=version_2, **kwargs), rows


def logits_with(rows, spans: dict[int, list[tuple[int, float, float]]]) -> dict[int, np.ndarray]:
    """Logits 0 everywhere except the given (position, start logit, end logit) per window."""
    out = {}
    for f, ids in enumerate(rows["input_ids"]):
        window = np.zeros((len(ids), 2))
        for position, start, end in spans.get(f, []):
            window[position] += (start, end)
        out[f] = window
    return out


def test_post_processing_picks_the_best_valid_span_across_windows(tokenizer):
    context = " ".join(["river", "film", "game", "music", "house", "school", "team"] * 5)
    post, rows = answers_for(tokenizer, context, "q", Windowing(20, 6, 2), version_2=False, max_answer_length=3)
    offsets, flags = rows["offsets"], rows["max_context"]
    assert len(rows["input_ids"]) > 2

    def position(window: int, char: int) -> int:
        return next(i for i, (s, _) in enumerate(offsets[window]) if s == char)

    # A token both windows 0 and 1 hold, whose most context is in window 1.
    shared = [s for (s, _), flag in zip(offsets[1], flags[1], strict=True) if flag and s >= 0]
    char = next(c for c in shared if any(s == c for s, _ in offsets[0]) and not flags[0][position(0, c)])
    after = next(s for s, _ in offsets[1] if s > char)  # the next token, the span's end
    in_2 = [i for i, ((s, _), flag) in enumerate(zip(offsets[2], flags[2], strict=True)) if flag and s >= 0]
    too_long_start = in_2[0]
    logits = logits_with(
        rows,
        {
            # Window 0 scores the span highest, but window 0 is not where its start has the most context.
            0: [(position(0, char), 9.0, 0), (position(0, after), 0, 9.0), (1, 20.0, 20.0)],  # 1: a question token
            1: [(position(1, char), 5.0, 0), (position(1, after), 0, 5.0)],
            # Window 2: a 4-token span (over max_answer_length) and an end before its start.
            2: [(too_long_start, 8.0, 0), (too_long_start + 3, 0, 8.0), (in_2[-1], 7.5, 0), (in_2[-2], 0, 7.5)],
        },
    )
    answer = post.answer(0, logits)
    end_char = next(e for s, e in offsets[1] if s == after)
    assert answer.text == context[char:end_char] and len(answer.text.split()) == 2
    assert answer.nbest[0]["text"] == answer.text and answer.nbest[0]["start_logit"] == 5.0
    assert sum(c["probability"] for c in answer.nbest) == pytest.approx(1.0)
    assert len({c["text"] for c in answer.nbest}) == len(answer.nbest) <= 20
    # With a longer max_answer_length the window-2 span wins.
    post.max_answer_length = 4
    assert len(post.answer(0, logits).text.split()) == 4


def test_v2_null_odds_use_the_lowest_null_score_over_windows(tokenizer):
    context = " ".join(f"w{i}" for i in range(30))
    post, rows = answers_for(tokenizer, context, "q", Windowing(20, 6, 2), version_2=True)
    first_0 = min(i for i, (s, _) in enumerate(rows["offsets"][0]) if s >= 0)
    spans = {f: [(0, 2.0, 2.0)] for f in range(len(rows["input_ids"]))}  # null score 4 ...
    spans[1] = [(0, 1.0, 0.5)]  # ... but 1.5 in window 1: the lowest counts
    spans[0].append((first_0, 3.0, 0.0))
    spans[0].append((first_0 + 1, 0.0, 3.0))
    answer = post.answer(0, logits_with(rows, spans))
    assert answer.text == context[rows["offsets"][0][first_0][0] : rows["offsets"][0][first_0 + 1][1]]
    assert answer.null_odds == pytest.approx(1.5 - 6.0)
    assert "" in [c["text"] for c in answer.nbest]
    assert post.predictions([answer], threshold=0.0) == {"q": answer.text} and answer.text
    assert post.predictions([answer], threshold=-5.0) == {"q": ""}


def test_a_question_without_windows_is_answered_empty(tokenizer):
    raw = examples([("empty", "", "what", ["x"], [0]), ("ok", "w1 w2", "what", ["w2"], [3])])
    rows, problems = make_windows(raw, tokenizer, Windowing(24, 8, 4), training=False, version_2=True)
    assert problems.counts() == {"empty_context": 1} and rows["example_idx"] == [1]
    post = SquadAnswers(raw, datasets.Dataset.from_dict(rows), version_2=True)
    answers = post.answers(logits_with(rows, {}))
    assert answers[0].text == "" and answers[0].null_odds == NO_CANDIDATE_ODDS


# Random logits: with seed 0 nothing beats "no answer everywhere"; with seed 4 a threshold does.
@pytest.mark.parametrize("seed", [0, 4])
def test_the_tuned_threshold_reaches_the_official_best_f1(tokenizer, tmp_path, seed):
    rng = np.random.default_rng(seed)
    articles = squad_articles(6, seed=3, unanswerable=True)
    raw = read_official_file(write_official(tmp_path / "dev.json", articles, "v2.0"), "dev")
    rows, _ = make_windows(raw, tokenizer, Windowing(48, 16, 16), training=False, version_2=True)
    post = SquadAnswers(raw, datasets.Dataset.from_dict(rows), version_2=True)
    logits = {f: rng.normal(size=(len(ids), 2)) for f, ids in enumerate(rows["input_ids"])}
    scores, answers, _ = post.score(logits)
    threshold = post.threshold(answers)
    official = evaluate_v2(post.golds, {a.id: a.text for a in answers}, {a.id: a.null_odds for a in answers})
    assert scores["f1"] == pytest.approx(official["best_f1"])
    assert scores["null_threshold"] == threshold
    # Clear of every question's odds, unlike the official value (one question's odds, on the boundary), and with the
    # same predictions as the official threshold makes where one beats "no answer everywhere".
    odds = [a.null_odds for a in answers]
    assert min(abs(o - threshold) for o in odds) > 1e-3
    if official["best_f1"] > official["NoAns_total"] * 100 / official["total"]:
        assert official["best_f1_thresh"] in odds
        assert post.predictions(answers, threshold) == post.predictions(answers, official["best_f1_thresh"])
    else:
        assert all(text == "" for text in post.predictions(answers, threshold).values())


# -- the head --------------------------------------------------------------------------------------------------


def test_the_head_and_loss_equal_transformers_bert_for_question_answering(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    reference = transformers.BertForQuestionAnswering(config).eval()
    reference.save_pretrained(tmp_path / "qa")
    pretrained = load_pretrained(str(tmp_path / "qa"))
    ours = BertForQuestionAnswering(BertConfig.from_dict(pretrained.config))
    assert load_into(ours, pretrained) == []  # qa_outputs comes across too
    ours.eval()
    input_ids = torch.randint(1, 99, (3, 20))
    token_type_ids = (torch.arange(20) >= 8).long().expand(3, 20)
    attention_mask = torch.ones(3, 20, dtype=torch.long)
    starts, ends = torch.tensor([0, 9, 12]), torch.tensor([0, 11, 12])
    batch = {"attention_mask": attention_mask, "start_positions": starts, "end_positions": ends}
    with torch.no_grad():
        start_logits, end_logits = ours(input_ids, token_type_ids, attention_mask)
        out = reference(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            start_positions=starts,
            end_positions=ends,
        )
    torch.testing.assert_close(start_logits, out.start_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(end_logits, out.end_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(span_loss(start_logits, end_logits, batch), out.loss, atol=1e-5, rtol=1e-5)


def test_the_loss_does_not_depend_on_padding():
    torch.manual_seed(0)
    start, end = torch.randn(2, 10), torch.randn(2, 10)
    batch = {
        "attention_mask": torch.ones(2, 10, dtype=torch.long),
        "start_positions": torch.tensor([1, 4]),
        "end_positions": torch.tensor([2, 9]),
    }
    padded = {**batch, "attention_mask": torch.cat([batch["attention_mask"], torch.zeros(2, 6, dtype=torch.long)], 1)}
    pad_logits = torch.full((2, 6), 3.0)  # padding with high logits must not matter
    loss = span_loss(start, end, batch)
    assert span_loss(torch.cat([start, pad_logits], 1), torch.cat([end, pad_logits], 1), padded) == pytest.approx(
        loss.item()
    )


# -- end to end ------------------------------------------------------------------------------------------------


def squad_overrides(version: str, files: dict, hf_dir, extra: tuple = ()) -> list[str]:
    return [
        f"task=squad_v{version[0]}",
        f"init_from={hf_dir}",
        "trainer=cpu",
        "logger=csv",
        "task.batch_size=8",
        "task.max_seq_length=64",
        "task.doc_stride=16",
        "task.max_query_length=16",
        "task.datamodule.num_workers=0",
        "trainer.max_epochs=2",
        # A "+split" key adds a split the config does not list (to test that it is refused).
        *(
            f"{'+' if split[0] == '+' else ''}task.data_files.{split.lstrip('+')}={path}"
            for split, path in files.items()
        ),
        *extra,
    ]


def squad_eval_cli(*args) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "lightbert.tasks.squad.official_eval", *map(str, args)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_squad_v1_fine_tunes_on_official_files_and_writes_scored_predictions(hf_dir, tmp_path):
    files = squad_data_files(tmp_path / "data", "1.1")
    results = train(compose_config(squad_overrides("1.1", files, hf_dir), tmp_path / "run"))
    assert results["monitor"] == "val/f1" and "val/exact_match" in results["metrics"]
    out = tmp_path / "run" / "predictions"
    predictions = json.loads((out / "predictions.json").read_text())
    dev = json.loads(files["validation"].read_text())
    ids = [qa["id"] for a in dev["data"] for p in a["paragraphs"] for qa in p["qas"]]
    assert sorted(predictions) == sorted(ids) and all(isinstance(v, str) for v in predictions.values())
    contexts = {qa["id"]: p["context"] for a in dev["data"] for p in a["paragraphs"] for qa in p["qas"]}
    assert all(text and text in contexts[qid] for qid, text in predictions.items())  # spans of the context
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert all(nbest[qid][0]["text"] == text for qid, text in predictions.items())
    # The official scorer, run on the written file, gives what the run reported.
    scores = squad_eval_cli(files["validation"], out / "predictions.json")
    assert scores == pytest.approx(json.loads((out / "eval.json").read_text()))
    assert not (out / "null_odds.json").exists()
    module = QuestionAnsweringModule.load_from_checkpoint(results["best_checkpoint"], weights_only=True)
    assert isinstance(module.model, BertForQuestionAnswering)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_squad_v2_fine_tunes_on_hub_schema_files_with_a_tuned_null_threshold(hf_dir, tmp_path, fmt):
    files = squad_data_files(tmp_path / "data", "2.0", fmt=fmt)
    results = train(compose_config(squad_overrides("2.0", files, hf_dir), tmp_path / "run"))
    metrics = results["metrics"]
    for name in ("exact", "f1", "HasAns_f1", "NoAns_f1", "null_threshold"):
        assert f"val/{name}" in metrics
    out = tmp_path / "run" / "predictions"
    predictions = json.loads((out / "predictions.json").read_text())
    odds = json.loads((out / "null_odds.json").read_text())
    assert sorted(predictions) == sorted(odds)
    written = json.loads((out / "eval.json").read_text())
    threshold = written.pop("null_threshold")
    assert all((predictions[q] == "") == (odds[q] > threshold) for q in predictions)
    # Score again with the official v2.0 algorithm from an official-format copy of the dev data.
    dev_rows = datasets.load_dataset(fmt if fmt == "parquet" else "json", data_files=str(files["validation"]))["train"]
    official = tmp_path / "dev.json"
    paragraphs = [
        {"context": r["context"], "qas": [{"id": r["id"], "question": r["question"], "answers": _answers(r)}]}
        for r in dev_rows
    ]
    write_official(official, [{"title": "t", "paragraphs": paragraphs}], "v2.0")
    scores = squad_eval_cli(official, out / "predictions.json", "-n", out / "null_odds.json", "-t", threshold)
    assert scores == pytest.approx(written)
    assert scores["f1"] == pytest.approx(scores["best_f1"])  # the threshold was tuned for F1 on this set


def _answers(row: dict) -> list[dict]:
    return [{"text": t, "answer_start": s} for t, s in zip(*row["answers"].values(), strict=True)]


def test_a_configured_null_threshold_is_used_as_given(hf_dir, tmp_path):
    files = squad_data_files(tmp_path / "data", "2.0", num_paragraphs=2)
    extra = ("task.null_score_diff_threshold=1000.0", "trainer.max_epochs=1")
    results = train(compose_config(squad_overrides("2.0", files, hf_dir, extra), tmp_path / "run"))
    assert results["metrics"]["val/null_threshold"] == 1000.0
    predictions = json.loads((tmp_path / "run" / "predictions" / "predictions.json").read_text())
    assert all(text for text in predictions.values())  # odds never exceed 1000: every question answered


def test_bad_input_is_reported_with_counts(hf_dir, tmp_path, caplog):
    articles = squad_articles(4, seed=1)
    paragraphs = articles[0]["paragraphs"]
    paragraphs[0]["qas"][0]["answers"][0]["answer_start"] += 3  # points past the answer
    paragraphs[1]["qas"][0]["question"] = "what " * 40  # longer than max_query_length
    paragraphs[2]["context"] = ""  # its questions' answers cannot be found either
    files = {
        "train": write_official(tmp_path / "train.json", articles),
        "validation": write_official(tmp_path / "dev.json", squad_articles(2, seed=2)),
    }
    with caplog.at_level(logging.WARNING, logger="lightbert.tasks.squad.data"):
        train(compose_config(squad_overrides("1.1", files, hf_dir, ("trainer.max_epochs=1",)), tmp_path / "run"))
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "SQuAD train: 1 answers do not start at their answer_start" in messages
    assert "SQuAD train: 3 examples have an empty context" in messages
    assert "questions longer than task.max_query_length tokens were cut" in messages


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda files: files.pop("validation"), "task.data_files.validation=PATH"),
        (lambda files: files.update({"+test": files["train"]}), "unknown split(s) ['test']"),
        (lambda files: files.update(train=files["train"].with_name("nope.json")), "does not exist"),
    ],
)
def test_data_file_mistakes_get_one_clear_error(hf_dir, tmp_path, mutate, message):
    files = squad_data_files(tmp_path / "data", "1.1", num_paragraphs=2)
    mutate(files)
    with pytest.raises(UserError, match=re.escape(message)):
        train(compose_config(squad_overrides("1.1", files, hf_dir), tmp_path / "run"))


def test_wrong_columns_and_unanswerable_v1_questions_are_refused(hf_dir, tmp_path):
    files = squad_data_files(tmp_path / "data", "1.1", num_paragraphs=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "1", "context": "c", "query": "q"}) + "\n")
    with pytest.raises(UserError, match=r"lacks the column\(s\) \['question', 'answers'\]"):
        train(compose_config(squad_overrides("1.1", {**files, "train": bad}, hf_dir), tmp_path / "run1"))
    v2_dev = write_flat(tmp_path / "dev2.jsonl", squad_articles(2, seed=5, unanswerable=True))
    with pytest.raises(UserError, match="use task=squad_v2"):
        train(compose_config(squad_overrides("1.1", {**files, "validation": v2_dev}, hf_dir), tmp_path / "run2"))


def test_window_settings_that_leave_no_room_are_refused():
    with pytest.raises(UserError, match="leaves no room for the context"):
        Windowing(max_seq_length=64, doc_stride=16, max_query_length=61)


@pytest.mark.slow
def test_two_process_ddp_scores_every_window_once(hf_dir, tmp_path):
    """Each process validates half the windows; gathered, the scores and predictions equal one process's."""
    files = squad_data_files(tmp_path / "data", "2.0", num_paragraphs=6)
    outputs = {}
    for devices in (1, 2):
        run = tmp_path / f"run{devices}"
        overrides = squad_overrides("2.0", files, hf_dir, ())
        overrides += ["trainer.max_epochs=1", "optim.lr=1e-9"]  # the weights stay as loaded
        if devices == 1:  # the reference, in this process; two DDP processes are a command's
            train(compose_config(overrides, run))
        else:
            result = run_train_forked(*overrides, "trainer.devices=2", "trainer.strategy=ddp", f"hydra.run.dir={run}")
            assert result.returncode == 0, result.stderr[-3000:]
        metrics = json.loads((run / "results.json").read_text())["metrics"]
        predictions = json.loads((run / "predictions" / "predictions.json").read_text())
        odds = json.loads((run / "predictions" / "null_odds.json").read_text())
        outputs[devices] = metrics, predictions, odds
    (one, predictions_1, odds_1), (two, predictions_2, odds_2) = outputs[1], outputs[2]
    for name in ("val/exact", "val/f1", "val/HasAns_f1", "val/NoAns_f1", "val/null_threshold"):
        assert two[name] == pytest.approx(one[name], abs=1e-4), name
    assert predictions_2 == predictions_1 and len(predictions_1) == 12
    assert odds_2 == pytest.approx(odds_1, abs=1e-4)


def test_hub_data_without_network_says_to_give_local_files(hf_dir, tmp_path, monkeypatch):
    # What HF_HUB_OFFLINE=1 does, set after the libraries read it: fail at once instead of retrying.
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"could not load rajpurkar/squad_v2 \[train\].*task.data_files.train=PATH"):
        train(compose_config(squad_overrides("2.0", {}, hf_dir), tmp_path / "run"))


def test_fine_tuning_without_init_from_says_what_to_give(tmp_path):
    files = squad_data_files(tmp_path / "data", "1.1", num_paragraphs=2)
    overrides = [o for o in squad_overrides("1.1", files, "x") if not o.startswith("init_from")]
    with pytest.raises(UserError, match="task=squad_v1 fine-tunes a pre-trained model: set init_from="):
        train(compose_config(overrides, tmp_path / "run"))
