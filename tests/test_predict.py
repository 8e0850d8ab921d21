"""`src/predict.py`: a fine-tuned model's predictions on new records equal the run's own, for every head, whatever the
batch size or order; bad input is one clear message and no output file."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess

import numpy as np
import pytest
import torch
from helpers import runtime
from helpers.ner_files import read_conlleval
from helpers.predictions import predict, predict_config, records_of, rows
from helpers.runs import REPO, run_script_forked

from lightbert.errors import UserError
from lightbert.inference.predict import predict_records, predict_to_file, read_records
from lightbert.tasks.finetuned import load_finetuned


def predict_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return run_script_forked("predict", *args, stdin=stdin)  # a process of its own, forked: helpers.fork_server


# -- equal to the run's own predictions -----------------------------------------------------------------------


def test_classification_equals_the_runs_submission_file(sst2_run, tmp_path):
    test_rows = rows(sst2_run.files["test"])
    predictions = predict(sst2_run.dir, [{"sentence": r["sentence"], "id": r["idx"]} for r in test_rows], tmp_path)
    submitted = list(csv.DictReader((sst2_run.dir / "predictions" / "SST-2.tsv").open(), delimiter="\t"))
    labels = ("negative", "positive")
    assert [str(labels.index(p["label"])) for p in predictions] == [r["prediction"] for r in submitted]
    assert [p["id"] for p in predictions] == [int(r["index"]) for r in submitted]
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-5 for p in predictions)
    # The generic field name reads the same text the same way.
    generic = predict(sst2_run.dir, [{"text": r["sentence"]} for r in test_rows], tmp_path)
    assert [p["label"] for p in generic] == [p["label"] for p in predictions]


def test_regression_scores_equal_the_runs_submission_file(stsb_run, tmp_path):
    test_rows = rows(stsb_run.files["test"])
    records = [{"text": r["sentence1"], "text_pair": r["sentence2"]} for r in test_rows]
    predictions = predict(stsb_run.dir, records, tmp_path)
    submitted = list(csv.DictReader((stsb_run.dir / "predictions" / "STS-B.tsv").open(), delimiter="\t"))
    clipped = [min(5.0, max(0.0, p["score"])) for p in predictions]
    assert clipped == pytest.approx([float(r["prediction"]) for r in submitted], abs=6e-4)  # the file has 3 decimals


def test_question_answering_equals_the_runs_dev_predictions_with_its_null_threshold(squad_v2_run, tmp_path):
    dev = rows(squad_v2_run.files["validation"])
    records = [{"id": r["id"], "question": r["question"], "context": r["context"]} for r in dev]
    predictions = predict(squad_v2_run.dir, records, tmp_path)
    written = json.loads((squad_v2_run.dir / "predictions" / "predictions.json").read_text())
    odds = json.loads((squad_v2_run.dir / "predictions" / "null_odds.json").read_text())
    assert {p["id"]: p["answer"] for p in predictions} == written
    assert any(p["no_answer"] for p in predictions) or all(written.values())
    for record, p in zip(records, predictions, strict=True):
        assert p["null_odds"] == pytest.approx(odds[p["id"]], abs=1e-4)
        if not p["no_answer"]:  # the character offsets cut the answer out of the context
            assert record["context"][p["start"] : p["end"]] == p["answer"] and 0 < p["score"] <= 1


def test_token_classification_equals_the_runs_conlleval_predictions(ner_run, tmp_path):
    sentences = read_conlleval(ner_run.dir / "predictions" / "validation.txt")
    predictions = predict(ner_run.dir, [{"words": [w for w, _, _ in s]} for s in sentences], tmp_path)
    assert [p["tags"] for p in predictions] == [[tag for _, _, tag in s] for s in sentences]
    # Raw text: split into the same words, and each entity's characters are its text.
    texts = [" ".join(w for w, _, _ in s) for s in sentences]
    from_text = predict(ner_run.dir, [{"text": t} for t in texts], tmp_path)
    assert [p["tags"] for p in from_text] == [p["tags"] for p in predictions]
    for text, p in zip(texts, from_text, strict=True):
        for entity in p["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["text"]
            assert entity["text"] == " ".join(p["words"][entity["word_start"] : entity["word_end"]])


def test_multiple_choice_accuracy_equals_the_runs_best_dev_accuracy(swag_run, tmp_path):
    dev = rows(swag_run.files["validation"])
    columns = ["sent1", "sent2", *(f"ending{i}" for i in range(4))]
    predictions = predict(swag_run.dir, [{c: r[c] for c in columns} for r in dev], tmp_path)
    accuracy = sum(p["choice"] == r["label"] for p, r in zip(predictions, dev, strict=True)) / len(dev)
    assert accuracy == pytest.approx(swag_run.results["best_score"], abs=1e-6)
    # The generic form: a context, the start of the next sentence, and the endings.
    generic = [
        {"context": r["sent1"], "start": r["sent2"], "endings": [r[f"ending{i}"] for i in range(4)]} for r in dev
    ]
    assert [p["choice"] for p in predict(swag_run.dir, generic, tmp_path)] == [p["choice"] for p in predictions]


# -- independent of batch size and order ----------------------------------------------------------------------


def assert_close(a, b, path="prediction"):
    if isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-5), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@pytest.mark.parametrize("run_name", ["sst2_run", "squad_v2_run", "ner_run", "swag_run"])
def test_predictions_do_not_depend_on_batch_size_or_order(run_name, request):
    run = request.getfixturevalue(run_name)
    finetuned = load_finetuned(str(run.dir))
    records = list(enumerate(records_of(run), start=1))
    reference = predict_records(finetuned, records, batch_size=1)[0].predictions
    shuffled = random.Random(0).sample(records, len(records))
    for batch_size, order in ((5, records), (64, shuffled)):
        predicted = predict_records(finetuned, order, batch_size=batch_size)[0].predictions
        by_line = dict(zip((n for n, _ in order), predicted, strict=True))
        for number, expected in zip((n for n, _ in records), reference, strict=True):
            if "null_odds" in expected and abs(expected["null_odds"] - finetuned.settings["null_threshold"]) < 1e-5:
                # Within float noise of the threshold the answer may go either way. The tuned threshold sits halfway
                # between two dev questions' odds, so only two questions 2e-5 apart can come here.
                assert by_line[number]["null_odds"] == pytest.approx(expected["null_odds"], abs=1e-5)
                continue
            assert_close(by_line[number], expected)


# -- the command ------------------------------------------------------------------------------------------------


def test_stdin_to_stdout_with_plain_text_a_progress_line_and_throughput(sst2_run):
    text = "The film was great.\n\nThe war was awful and the city was old.\n"
    run = predict_cli(f"init_from={sst2_run.dir}", "input_file=-", "output_file=-", stdin=text)
    assert run.returncode == 0, run.stderr
    predictions = [json.loads(line) for line in run.stdout.splitlines()]  # stdout holds the predictions alone
    assert len(predictions) == 2 and all(p["label"] in ("negative", "positive") for p in predictions)
    assert "predicted 2 record(s)" in run.stderr and "records/s" in run.stderr
    assert "best checkpoint" in run.stderr  # which checkpoint was loaded


# -- bad input ----------------------------------------------------------------------------------------------------


BAD_INPUT = {
    "missing field": ("sst2_run", '{"sentence_a": "the film"}\n', [], "no 'text' field"),
    "empty text": ("sst2_run", '{"text": "  "}\n', [], "'text' is empty"),
    "not json": ("sst2_run", '{"text": "the film"\n', [], "line 1 is not valid JSON"),
    "question answering records for a classifier": (
        "sst2_run",
        '{"question": "who?", "context": "the man"}\n',
        [],
        r"a sequence classification model \(sst2\), which reads",
    ),
    "plain text for question answering": ("squad_v2_run", "who ran?\n", [], "reads JSON lines"),
    "missing context": ("squad_v2_run", '{"question": "who ran?"}\n', [], "no 'context' field"),
    "one ending": ("swag_run", '{"context": "the man", "endings": ["runs"]}\n', [], "at least two strings"),
    "words not strings": ("ner_run", '{"words": ["the", 3]}\n', [], "list of non-empty strings"),
    "longer than the model's positions": ("sst2_run", "the film\n", ["max_seq_length=4096"], "positions"),
    "a pre-trained model without a head": ("bert", "the film\n", [], "has no fine-tuned head"),
    "no such input": ("sst2_run", None, [], "does not exist"),
    "a lone surrogate": ("sst2_run", '{"text": "the \\ud800 film"}\n', [], "lone surrogate"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_message_and_writes_nothing(case, request, tmp_path):
    run_name, text, extra, message = BAD_INPUT[case]
    run = request.getfixturevalue("sst2_run" if run_name == "bert" else run_name)
    init_from = run.dir.parent / "bert" if run_name == "bert" else run.dir
    source = tmp_path / "in.txt"
    if text is not None:
        source.write_text(text)
    out = tmp_path / "out.jsonl"
    with pytest.raises(UserError, match=message):
        predict_to_file(predict_config(init_from, source, out, *extra))
    assert not out.exists() and list(tmp_path.iterdir()) == ([source] if text is not None else [])


def test_an_output_directory_is_refused_before_any_work(sst2_run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the film\n")
    with pytest.raises(UserError, match="is a directory; give a file name"):
        predict_to_file(predict_config(sst2_run.dir, source, tmp_path, "overwrite=true"))


def test_bytes_that_are_not_text_on_standard_input_are_one_line(sst2_run):
    run = subprocess.run(
        [
            runtime.python(),
            str(REPO / "src" / "predict.py"),
            f"init_from={sst2_run.dir}",
            "input_file=-",
            "output_file=-",
        ],
        input=bytes(range(128, 256)),
        capture_output=True,
        cwd=REPO,
    )
    assert run.returncode == 2 and b"Traceback" not in run.stderr
    assert b"lightbert: error: input_file=- (standard input) is not UTF-8 text" in run.stderr


def test_the_command_line_says_one_line_and_exits_2(sst2_run, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "fine"}\n{"question": "who?"}\n')
    run = predict_cli(f"init_from={sst2_run.dir}", f"input_file={source}", f"output_file={tmp_path / 'out.jsonl'}")
    assert run.returncode == 2 and not (tmp_path / "out.jsonl").exists()
    assert run.stderr.strip().splitlines()[-1].startswith("lightbert: error: input_file line 2: no 'text' field")
    assert "Traceback" not in run.stderr


def test_long_texts_are_cut_as_in_training_and_counted(sst2_run, tmp_path, capsys):
    predictions = predict(sst2_run.dir, [{"text": "the film " * 100}, {"text": "good"}], tmp_path)
    assert len(predictions) == 2
    assert "1 record(s) were cut to max_seq_length=32 tokens" in capsys.readouterr().err


def test_an_existing_output_is_never_overwritten_without_asking(sst2_run, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("keep me\n")
    source = tmp_path / "in.txt"
    source.write_text("good\n")
    with pytest.raises(UserError, match="exists; choose another name or pass overwrite=true"):
        predict_to_file(predict_config(sst2_run.dir, source, out))
    assert out.read_text() == "keep me\n"


def test_plain_text_and_json_lines_are_told_apart(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert read_records(str(source)) == ([(1, {"text": "a"}), (3, {"text": "b"})], "jsonl")
    source.write_text("a b\n c \n")
    assert read_records(str(source)) == ([(1, {"text": "a b"}), (2, {"text": "c"})], "text")


@pytest.mark.parametrize("closed", ["stdin", "stdout"])
def test_a_closed_standard_stream_is_one_line(sst2_run, tmp_path, closed):
    source = tmp_path / "in.txt"
    source.write_text("the film\n")
    descriptor = 0 if closed == "stdin" else 1
    args = ["input_file=-", f"output_file={tmp_path / 'out.jsonl'}"] if closed == "stdin" else [
        f"input_file={source}", "output_file=-"]  # fmt: skip
    run = subprocess.run(
        [runtime.python(), str(REPO / "src" / "predict.py"), f"init_from={sst2_run.dir}", *args],
        stdin=subprocess.DEVNULL if closed == "stdout" else None,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=lambda: os.close(descriptor),
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "which is closed" in run.stderr


@pytest.mark.parametrize("run_name", ["sst2_run", "ner_run"])
def test_bf16_predictions_give_the_fp32_labels(run_name, request):
    """dtype=bf16 (predict's default on a GPU) runs under bf16 autocast: the same labels as fp32, probabilities
    close (bf16 keeps 8 bits of mantissa; on CPU here, which has bf16 kernels too)."""
    run = request.getfixturevalue(run_name)
    finetuned = load_finetuned(str(run.dir))
    records = list(enumerate(records_of(run), start=1))
    fp32 = predict_records(finetuned, records, dtype="fp32")[0].predictions
    bf16 = predict_records(finetuned, records, dtype="bf16")[0].predictions
    for a, b in zip(fp32, bf16, strict=True):
        assert a.get("label", a.get("tags")) == b.get("label", b.get("tags"))
        if "probabilities" in a:
            assert a["probabilities"].keys() == b["probabilities"].keys()
            assert np.allclose(list(a["probabilities"].values()), list(b["probabilities"].values()), atol=2e-2)


def test_batch_size_and_dtype_follow_the_device():
    from lightbert.inference.predict import batch_size_for, dtype_for

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (batch_size_for("auto", cpu), batch_size_for("auto", cuda), batch_size_for(8, cuda)) == (64, 256, 8)
    assert (dtype_for("auto", cpu), dtype_for("auto", cuda), dtype_for("fp32", cuda)) == ("fp32", "bf16", "fp32")
    with pytest.raises(UserError, match="batch_size=0 must be a number of sequences"):
        batch_size_for(0, cpu)
    with pytest.raises(UserError, match="dtype=fp16 is not known; use auto, fp32 or bf16"):
        dtype_for("fp16", cpu)
