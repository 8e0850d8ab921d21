"""Exports of fine-tuned models: `convert to-hf` for every head (transformers' AutoModelFor... and pipeline give the
same logits and answers) and `convert to-onnx` (onnxruntime gives PyTorch's outputs on padded batches)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import transformers
from helpers.filesystems import full_disk, mount_point, read_only_directory
from helpers.models import random_batch
from helpers.predictions import predict, records_of

from lightbert.interop.convert import main as convert
from lightbert.tasks.finetuned import load_finetuned

RUNS = ["sst2_run", "stsb_run", "squad_v2_run", "ner_run", "swag_run"]
AUTO_CLASSES = {
    "sequence_classification": transformers.AutoModelForSequenceClassification,
    "token_classification": transformers.AutoModelForTokenClassification,
    "question_answering": transformers.AutoModelForQuestionAnswering,
    "multiple_choice": transformers.AutoModelForMultipleChoice,
}


def padded_inputs(head: str, vocab: int) -> tuple[torch.Tensor, ...]:
    """A batch with padding (rows of 20, 13 and 7 real tokens); (B, C, T) for multiple choice."""
    if head != "multiple_choice":
        return random_batch(vocab=vocab)
    input_ids, token_type_ids, attention_mask = random_batch(batch=6, vocab=vocab)
    attention_mask[1, 13:], attention_mask[4, 7:] = 0, 0
    return tuple(t.view(3, 2, -1) for t in (input_ids, token_type_ids, attention_mask))


def ours(finetuned, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        out = finetuned.model(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


def real_rows(head: str, tensors: list, attention_mask: torch.Tensor) -> list:
    """Per-token outputs at the real tokens only: what padding holds is nobody's business."""
    if head in ("token_classification", "question_answering"):
        return [t[attention_mask.bool()] for t in tensors]
    return tensors


@pytest.mark.parametrize("run_name", RUNS)
def test_to_hf_loads_with_the_auto_class_and_gives_equal_logits(run_name, request, tmp_path):
    run = request.getfixturevalue(run_name)
    out = tmp_path / "hf"
    assert convert(["to-hf", str(run.dir), str(out)]) == 0
    finetuned = load_finetuned(str(run.dir))
    hf = AUTO_CLASSES[finetuned.head].from_pretrained(out).eval()
    assert type(hf).__name__ == json.loads((out / "config.json").read_text())["architectures"][0]
    inputs = padded_inputs(finetuned.head, finetuned.config.vocab_size)
    with torch.no_grad():
        result = hf(input_ids=inputs[0], token_type_ids=inputs[1], attention_mask=inputs[2])
    theirs = [result.start_logits, result.end_logits] if finetuned.head == "question_answering" else [result.logits]
    for a, b in zip(
        real_rows(finetuned.head, ours(finetuned, inputs), inputs[2]),
        real_rows(finetuned.head, theirs, inputs[2]),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    if finetuned.labels:
        assert hf.config.id2label == dict(enumerate(finetuned.labels))
    # predict.py reads the exported directory as it reads the run: the same predictions.
    records = records_of(run) if run_name != "stsb_run" else [{"text": "a good film", "text_pair": "the film"}]
    assert predict(out, records, tmp_path) == predict(run.dir, records, tmp_path)


def test_text_classification_pipeline_gives_predicts_labels_and_probabilities(sst2_run, tmp_path):
    """The export's AutoTokenizer encodes as the run did ([CLS] and [SEP], cut at the run's max_seq_length with
    truncation=True), and its pipeline gives predict.py's labels and probabilities (ModernBERT: test_silent_round6)."""
    out = tmp_path / "hf"
    convert(["to-hf", str(sst2_run.dir), str(out)])
    records = records_of(sst2_run)
    texts = [r["text"] for r in records]
    tokenizer = load_finetuned(str(sst2_run.dir)).tokenizer
    length = json.loads((out / "config.json").read_text())["lightbert"]["settings"]["max_seq_length"]  # the run's
    ours = [[tokenizer.cls_id, *ids[: length - 2], tokenizer.sep_id] for ids in tokenizer.encode_batch(texts)]
    assert transformers.AutoTokenizer.from_pretrained(out)(texts, truncation=True)["input_ids"] == ours
    classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
    theirs = classify(texts, top_k=None, truncation=True)
    for prediction, scores in zip(predict(sst2_run.dir, records, tmp_path), theirs, strict=True):
        assert max(scores, key=lambda s: s["score"])["label"] == prediction["label"]
        for score in scores:
            assert score["score"] == pytest.approx(prediction["probabilities"][score["label"]], abs=1e-5)


def test_token_classification_pipeline_tags_tokens_as_the_model_does(ner_run, tmp_path):
    out = tmp_path / "hf"
    convert(["to-hf", str(ner_run.dir), str(out)])
    tag = transformers.pipeline("token-classification", model=str(out), device="cpu", ignore_labels=[])
    finetuned = load_finetuned(str(ner_run.dir))
    for record in records_of(ner_run)[:5]:
        text = " ".join(record["words"])
        tokens = tag(text)
        tokenizer = finetuned.tokenizer
        ids = [tokenizer.cls_id, *tokenizer.encode_batch([text])[0], tokenizer.sep_id]
        with torch.no_grad():
            logits = finetuned.model(torch.tensor([ids]))[0]
        labels = [finetuned.labels[int(i)] for i in logits.argmax(-1)[1:-1]]  # without [CLS] and [SEP]
        assert [t["entity"] for t in tokens] == labels


def test_a_feature_based_tagger_has_no_hugging_face_class_and_says_so(tmp_path, capsys):
    from lightbert.errors import UserError
    from lightbert.interop.hf import hf_head_config
    from lightbert.tasks.finetuned import FineTuned

    tagger = FineTuned(
        "token_classification", torch.nn.Linear(1, 1), None, None, ("O",), feature_based={"x": 1}, source="run"
    )
    with pytest.raises(UserError, match="feature-based tagger .* no Hugging Face class"):
        hf_head_config(tagger)


# -- ONNX ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_name", ["sst2_run", "squad_v2_run", "ner_run", "swag_run"])
def test_onnx_encoder_and_head_equal_pytorch_on_padded_batches(run_name, request, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    run = request.getfixturevalue(run_name)
    out = tmp_path / "onnx"
    assert convert(["to-onnx", str(run.dir), str(out)]) == 0
    finetuned = load_finetuned(str(run.dir))
    for batch in (padded_inputs(finetuned.head, finetuned.config.vocab_size), None):
        if batch is None:  # one example, another length: every axis is dynamic
            batch = tuple(t[:1, ..., :11] for t in padded_inputs(finetuned.head, finetuned.config.vocab_size))
        feed = dict(zip(("input_ids", "token_type_ids", "attention_mask"), (t.numpy() for t in batch), strict=True))
        head = onnxruntime.InferenceSession(str(out / "model.onnx")).run(None, feed)
        for a, b in zip(
            real_rows(finetuned.head, ours(finetuned, batch), batch[2]),
            real_rows(finetuned.head, [torch.from_numpy(x) for x in head], batch[2]),
            strict=True,
        ):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        if finetuned.head == "multiple_choice":
            continue  # the encoder takes (batch, sequence); checked with the other heads
        encoder = onnxruntime.InferenceSession(str(out / "encoder.onnx")).run(None, feed)
        with torch.no_grad():
            sequence_output, pooled, _ = finetuned.model.bert(*batch)
        real = batch[2].bool()
        np.testing.assert_allclose(encoder[0][real.numpy()], sequence_output[real].numpy(), atol=1e-4, rtol=0)
        if pooled is not None:
            np.testing.assert_allclose(encoder[1], pooled.numpy(), atol=1e-4, rtol=0)


def test_onnx_export_without_the_extra_says_what_to_install(sst2_run, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name in ("onnx", "onnxscript"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    with pytest.raises(SystemExit) as exit_info:
        convert(["to-onnx", str(sst2_run.dir), str(tmp_path / "onnx")])
    assert exit_info.value.code == 2
    assert not (tmp_path / "onnx").exists()


@contextmanager
def not_empty(path):
    path.mkdir()
    (path / "notes.txt").write_text("mine\n")
    yield path


# Where `convert to-hf` cannot publish its directory: (the place, the output directory in it, the one line's words)
UNWRITABLE = {
    "read-only": (read_only_directory, lambda place: place / "exported", "cannot write in {place} (a read-only"),
    "read-only, parents missing": (read_only_directory, lambda place: place / "a" / "b", "cannot write in {place}"),
    "a mount point": (mount_point, lambda place: place, "{place} is a mount point"),
    "not empty": (not_empty, lambda place: place, "{place} exists and is not empty"),
    "a full disk": (full_disk, lambda place: place / "a" / "model", "could not write {place}/a/model: "),
}


@pytest.mark.parametrize("case", list(UNWRITABLE))
def test_to_hf_where_it_cannot_write_is_one_line_and_creates_nothing(sst2_run, tmp_path, capsys, case):
    """Once an OSError traceback (a read-only directory, a mount point); a full disk left the parents it made."""
    place_of, out_of, message = UNWRITABLE[case]
    with place_of(tmp_path / "place") as place:
        before = sorted(place.rglob("*"))
        with pytest.raises(SystemExit) as exit_info:
            convert(["to-hf", str(sst2_run.dir), str(out_of(place))])
        assert sorted(place.rglob("*")) == before  # nothing created, not even a parent
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("lightbert: error: "), err
    assert message.format(place=place) in err and "nothing was written" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["place"]  # no temporary directory left beside it
