"""Checkpoints users bring: Hugging Face directories that transformers writes here (tiny, random), loaded as
init_from. A head is carried only where its meaning matches the task's, evaluation names predictions by the
checkpoint's labels, and what lightbert cannot run as transformers runs it is refused in one line up front."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
import transformers
from helpers.glue_files import glue_data_files, glue_overrides
from helpers.models import random_batch, write_hf_model
from helpers.ner_files import read_conlleval
from helpers.runs import compose_config

from lightbert import evaluate, train
from lightbert.checkpoints.reading import load_encoder, load_into, load_pretrained
from lightbert.errors import UserError
from lightbert.inference.predict import predict_records
from lightbert.interop.convert import to_hf
from lightbert.model import BertConfig, BertForPreTraining
from lightbert.tasks.finetuned import load_finetuned
from lightbert.tasks.glue.module import SequenceClassificationModule
from lightbert.tasks.glue.tasks import glue_task
from lightbert.tasks.heads import HEADS, carry_head, label_rows
from lightbert.tasks.ner.data import CONLL2003_LABELS

ATOL = 2e-5
SEQUENCE = HEADS["sequence_classification"]
# dslim/bert-base-NER's tag order: another order of CoNLL-2003's nine tags than the hub dataset's (lightbert's)
DSLIM_ORDER = ("O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")


def sst2_model(pretrained) -> SequenceClassificationModule:
    return SequenceClassificationModule(model=pretrained.config, optim={}, task="sst2")


def classifier_of(directory):
    return load_pretrained(str(directory)).state_dict["classifier.weight"]


# -- which head is carried, and how its labels are matched --------------------------------------------------------


def test_label_rows_match_by_name_whatever_the_case_and_order():
    assert label_rows(("negative", "positive"), ("negative", "positive"))[0] == (0, 1)
    assert label_rows(("POSITIVE", "NEGATIVE"), ("negative", "positive"))[0] == (1, 0)
    assert label_rows(DSLIM_ORDER, CONLL2003_LABELS)[0] == tuple(DSLIM_ORDER.index(t) for t in CONLL2003_LABELS)
    assert label_rows(("LABEL_0", "LABEL_1"), ("negative", "positive"))[0] == (0, 1)  # generic: by index
    assert label_rows(("LABEL_0",), ())[0] == (0,)  # one unnamed output: a regression
    assert label_rows(("negative", "neutral", "positive"), glue_task("mnli").label_names) is None
    assert label_rows(("not_equivalent", "equivalent"), ("not_duplicate", "duplicate")) is None
    assert label_rows(("negative", "negative"), ("negative", "positive")) is None


def test_a_classifier_saved_in_the_other_label_order_is_carried_with_its_rows_reordered(tmp_path, caplog):
    hf = write_hf_model(tmp_path / "hf", "BertForSequenceClassification", labels=("positive", "negative"))
    pretrained = load_pretrained(str(hf))
    module = sst2_model(pretrained)
    carry = carry_head(pretrained, SEQUENCE, SEQUENCE.arguments({"task": "sst2"}))
    assert carry.carry and carry.rows == (1, 0)
    assert "reordered to the task's order (negative, positive)" in carry.line
    assert load_into(module.model, pretrained, carry) == []
    theirs = pretrained.state_dict
    torch.testing.assert_close(module.model.classifier.weight, theirs["classifier.weight"][[1, 0]])
    torch.testing.assert_close(module.model.classifier.bias, theirs["classifier.bias"][[1, 0]])


def test_a_classifier_of_other_labels_starts_fresh_and_says_why(tmp_path):
    hf = write_hf_model(tmp_path / "hf", "BertForSequenceClassification", labels=("negative", "neutral", "positive"))
    pretrained = load_pretrained(str(hf))
    mnli = SEQUENCE.arguments({"task": "mnli"})
    carry = carry_head(pretrained, SEQUENCE, mnli)
    assert not carry.carry
    assert "['negative', 'neutral', 'positive'] are not the task's ['entailment', 'neutral', 'contradiction']" in (
        carry.line
    )
    module = SequenceClassificationModule(model=pretrained.config, optim={}, task="mnli")
    before = module.model.classifier.weight.detach().clone()
    assert load_into(module.model, pretrained, carry) == ["classifier.bias", "classifier.weight"]
    torch.testing.assert_close(module.model.classifier.weight, before)  # same shape, and still not carried


def test_a_tagger_in_another_tag_order_is_carried_into_conll2003_in_its_order(tmp_path):
    from lightbert.tasks.ner.module import TokenClassificationModule

    hf = write_hf_model(tmp_path / "hf", "BertForTokenClassification", labels=DSLIM_ORDER)
    pretrained = load_pretrained(str(hf))
    tokens = HEADS["token_classification"]
    carry = carry_head(pretrained, tokens, tokens.arguments({"label_names": list(CONLL2003_LABELS)}))
    module = TokenClassificationModule(model=pretrained.config, optim={}, label_names=list(CONLL2003_LABELS))
    assert carry.carry and load_into(module.model, pretrained, carry) == []
    rows = [DSLIM_ORDER.index(tag) for tag in CONLL2003_LABELS]
    torch.testing.assert_close(module.model.classifier.weight, pretrained.state_dict["classifier.weight"][rows])


def test_a_head_of_another_kind_is_never_carried_even_where_its_shape_fits(tmp_path):
    # A two-tag tagger's classifier is (2, H), as SST-2's is: carried today by its shape alone.
    hf = write_hf_model(tmp_path / "hf", "BertForTokenClassification", labels=("negative", "positive"))
    pretrained = load_pretrained(str(hf))
    carry = carry_head(pretrained, SEQUENCE, SEQUENCE.arguments({"task": "sst2"}))
    assert not carry.carry and "has a token classification head" in carry.line


def test_every_head_decision_is_one_console_line_of_a_fine_tune(tmp_path, caplog):
    hf = write_hf_model(tmp_path / "hf", "BertForSequenceClassification", labels=("NEGATIVE", "POSITIVE"))
    files = glue_data_files(tmp_path / "data", "sst2", "jsonl", num_rows=16)
    overrides = [*glue_overrides("sst2", files, hf), "trainer.max_epochs=1"]
    with caplog.at_level(logging.INFO, logger="lightbert"):
        train(compose_config(overrides, tmp_path / "run"))
    lines = [r.getMessage() for r in caplog.records if "head is carried" in r.getMessage() or "fresh" in r.getMessage()]
    assert lines == [
        f"the sequence classification head is carried from {hf}, its labels matched by name, in the same order"
    ]


# -- evaluation names predictions by the checkpoint's labels ------------------------------------------------------


def permuted_copy(exported, out, order: tuple[str, ...]):
    """The exported classifier, the same model, saved with its labels (and rows) in `order`."""
    shutil.copytree(exported, out)
    config = json.loads((out / "config.json").read_text())
    labels = [config["id2label"][str(i)].casefold() for i in range(len(config["id2label"]))]
    rows = [labels.index(name.casefold()) for name in order]
    config["id2label"] = {str(i): name for i, name in enumerate(order)}
    config["label2id"] = {name: i for i, name in enumerate(order)}
    (out / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    state = load_file(str(out / "model.safetensors"))
    state["classifier.weight"], state["classifier.bias"] = (
        state["classifier.weight"][rows],
        state["classifier.bias"][rows],
    )
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def evaluated(run, init_from, out):
    overrides = [
        o for o in run.overrides if not o.startswith(("init_from=", "trainer.max_epochs", "trainer.max_steps"))
    ]
    return evaluate(compose_config([*overrides, f"init_from={init_from}"], out, config_name="evaluate"))["metrics"]


@pytest.mark.slow
def test_evaluating_a_classifier_in_the_other_label_order_scores_the_same(sst2_run, tmp_path):
    exported = to_hf(str(sst2_run.dir), str(tmp_path / "hf"))
    reversed_labels = permuted_copy(exported, tmp_path / "reversed", ("POSITIVE", "NEGATIVE"))
    as_saved = evaluated(sst2_run, exported, tmp_path / "eval")
    assert as_saved["val/accuracy"] != pytest.approx(0.5)  # else a flipped head would score the same
    assert evaluated(sst2_run, reversed_labels, tmp_path / "eval_reversed") == pytest.approx(as_saved, abs=1e-6)
    # Prediction names each class as the checkpoint's id2label does: the same answers, in its spelling.
    records = [(i, {"text": text}) for i, text in enumerate(["the river city", "music film", "the team", "a film"])]
    named = [predict_records(load_finetuned(str(d)), records)[0].predictions for d in (exported, reversed_labels)]
    assert [p["label"].upper() for p in named[0]] == [p["label"] for p in named[1]]


@pytest.mark.slow
def test_evaluating_a_tagger_in_dslims_tag_order_names_its_tags_by_its_id2label(ner_run, tmp_path):
    exported = to_hf(str(ner_run.dir), str(tmp_path / "hf"))
    # The few-step run tags every word O; a classifier drawn at random tags with all nine, which is what naming needs.
    from safetensors.torch import load_file, save_file

    state = load_file(str(exported / "model.safetensors"))
    state["classifier.weight"] = torch.randn(
        state["classifier.weight"].shape, generator=torch.Generator().manual_seed(0)
    )
    save_file(state, str(exported / "model.safetensors"), metadata={"format": "pt"})
    dslim = permuted_copy(exported, tmp_path / "dslim", DSLIM_ORDER)
    as_saved = evaluated(ner_run, exported, tmp_path / "eval")
    assert evaluated(ner_run, dslim, tmp_path / "eval_dslim") == pytest.approx(as_saved, abs=1e-6)
    tagged = [read_conlleval(tmp_path / run / "predictions" / "validation.txt") for run in ("eval", "eval_dslim")]
    assert tagged[0] == tagged[1]  # word, gold tag and predicted tag, every one
    predicted = {tag for sentence in tagged[0] for _, _, tag in sentence}
    assert len(predicted - {"O"}) >= 3  # else another tag order could name them the same


def test_evaluating_a_classifier_of_other_labels_is_refused_naming_both_lists(sst2_run, tmp_path):
    hf = write_hf_model(tmp_path / "hf", "BertForSequenceClassification", labels=("bad", "good"))
    with pytest.raises(UserError, match=r"the labels \['bad', 'good'\], and task=.* the labels \['negative', 'pos"):
        evaluated(sst2_run, hf, tmp_path / "eval")
    assert not (tmp_path / "eval").exists() or not any((tmp_path / "eval").iterdir())


# -- refused up front, in one line ---------------------------------------------------------------------------------


def test_a_decoder_bert_runs_left_to_right_as_transformers_runs_it(tmp_path):
    hf_dir = write_hf_model(tmp_path / "hf", "BertLMHeadModel", is_decoder=True)
    pretrained = load_pretrained(str(hf_dir))
    assert pretrained.config["attention"] == "left_to_right"
    ours = BertForPreTraining(BertConfig.from_dict(pretrained.config), next_sentence=False)
    load_into(ours, pretrained)
    theirs = transformers.BertLMHeadModel.from_pretrained(hf_dir).eval()
    input_ids, token_type_ids, attention_mask = random_batch(vocab=pretrained.config["vocab_size"])
    attention_mask = torch.ones_like(attention_mask)  # left to right: every token real
    with torch.no_grad():
        mlm, _ = ours.eval()(input_ids, token_type_ids, attention_mask)
        reference = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(mlm, reference, atol=ATOL, rtol=0)


def test_a_decoder_berts_fine_tune_says_on_its_run_line_that_it_attends_left_to_right(tmp_path, caplog):
    """transformers fine-tunes a BERT with is_decoder: true left to right; so does lightbert, and its run line says so
    and why (once nothing did: a user expecting BERT's bidirectional encoder would not guess)."""
    hf = write_hf_model(tmp_path / "hf", "BertLMHeadModel", is_decoder=True)
    files = glue_data_files(tmp_path / "data", "sst2", "jsonl", num_rows=16)
    with caplog.at_level(logging.INFO, logger="lightbert"):
        train(compose_config([*glue_overrides("sst2", files, hf), "trainer.max_steps=1"], tmp_path / "run"))
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sst2: L2/")]
    assert "attention left to right (is_decoder: true in init_from's config.json" in line, line


def test_a_directory_with_safetensors_and_a_bin_reads_the_safetensors_and_says_so(tmp_path, caplog):
    """model.safetensors and a pytorch_model.bin of other weights (one left from an older save): transformers reads
    the safetensors; so does lightbert, and one console line says which file it read."""
    hf = write_hf_model(tmp_path / "hf", "BertForPreTraining", seed=0)
    other = write_hf_model(tmp_path / "other", "BertForPreTraining", seed=1, safe_serialization=False)
    shutil.copy(other / "pytorch_model.bin", hf / "pytorch_model.bin")
    with caplog.at_level(logging.INFO, logger="lightbert"):
        pretrained = load_pretrained(str(hf))
    said = [r.getMessage() for r in caplog.records if "pytorch_model.bin" in r.getMessage()]
    assert said == [f"{hf}: read model.safetensors, not pytorch_model.bin (both are there; safetensors first, as "
                    "transformers does)"]  # fmt: skip
    theirs = transformers.BertForPreTraining.from_pretrained(hf).state_dict()
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(pretrained.state_dict[key], theirs[key])


def test_cross_attention_is_refused_naming_it(tmp_path):
    hf_dir = write_hf_model(tmp_path / "hf", "BertLMHeadModel", is_decoder=True, add_cross_attention=True)
    with pytest.raises(UserError, match="add_cross_attention is true .* without cross-attention$"):
        load_pretrained(str(hf_dir))


@pytest.mark.parametrize(("task", "refused"), [("mrpc", True), ("sst2", False)])
def test_one_segment_models_on_sentence_pairs_are_refused_before_anything_is_written(tmp_path, task, refused):
    hf = write_hf_model(tmp_path / "hf", "BertModel", type_vocab_size=1)
    files = glue_data_files(tmp_path / "data", task, "jsonl", num_rows=16)
    cfg = compose_config([*glue_overrides(task, files, hf), "trainer.max_epochs=1"], tmp_path / "run")
    if not refused:
        assert train(cfg)["global_step"] == 2  # a single sentence uses segment 0 only: 16 rows, batches of 8
        return
    with pytest.raises(UserError, match=r"has type_vocab_size 1, and task=.* feeds 2 segments \(a sentence pair\)"):
        train(cfg)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize(
    ("entry", "value", "message"),
    [
        ("model_type", "albert", "has model_type 'albert'; lightbert loads BERT and ModernBERT models only"),
        ("position_embedding_type", "relative_key", "position_embedding_type 'relative_key' is not supported"),
    ],
)
def test_refusals_name_the_value_found(tmp_path, entry, value, message):
    hf_dir = write_hf_model(tmp_path / "hf", "BertModel")
    config = json.loads((hf_dir / "config.json").read_text())
    config[entry] = value
    (hf_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=message):
        load_pretrained(str(hf_dir))


# -- parity with transformers for every variant that loads -----------------------------------------------------------

VARIANTS = {
    "encoder": ("BertModel", {}),
    "encoder without pooler": ("BertModel", {"add_pooling_layer": False}),
    "pre-training": ("BertForPreTraining", {}),
    "masked LM": ("BertForMaskedLM", {}),
    "pytorch_model.bin": ("BertForPreTraining", {"safe_serialization": False}),
    "fp16 weights": ("BertForPreTraining", {"dtype": torch.float16}),
    "bf16 weights": ("BertForPreTraining", {"dtype": torch.bfloat16}),
    "eps 1e-6": ("BertForPreTraining", {"layer_norm_eps": 1e-6}),
    "vocab 30,523": ("BertModel", {"vocab_size": 30523}),
    "1,024 positions": ("BertModel", {"max_position_embeddings": 1024}),
    "one segment": ("BertModel", {"type_vocab_size": 1}),
    "classifier": ("BertForSequenceClassification", {"labels": ("a", "b", "c")}),
    "question answering": ("BertForQuestionAnswering", {}),
    "tagger": ("BertForTokenClassification", {"labels": DSLIM_ORDER}),
}


def reference_outputs(hf_dir, architecture: str, batch, **options) -> dict[str, torch.Tensor]:
    cls = getattr(transformers, architecture)
    theirs = cls.from_pretrained(hf_dir, dtype=torch.float32, **options).eval()
    input_ids, token_type_ids, attention_mask = batch
    with torch.no_grad():
        out = theirs(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    names = ("last_hidden_state", "pooler_output", "prediction_logits", "seq_relationship_logits", "logits",
             "start_logits", "end_logits")  # fmt: skip
    return {name: getattr(out, name) for name in names if getattr(out, name, None) is not None}


def our_outputs(hf_dir, architecture: str, batch) -> dict[str, torch.Tensor]:
    pretrained = load_pretrained(str(hf_dir))
    input_ids, token_type_ids, attention_mask = batch
    with torch.no_grad():
        if architecture == "BertModel":
            pooler = "bert.pooler.dense.weight" in pretrained.state_dict
            sequence, pooled, _ = load_encoder(pretrained, pooler)(input_ids, token_type_ids, attention_mask)
            return {"last_hidden_state": sequence, **({"pooler_output": pooled} if pooler else {})}
        if architecture in ("BertForPreTraining", "BertForMaskedLM"):
            nsp = architecture == "BertForPreTraining"
            model = BertForPreTraining(BertConfig.from_dict(pretrained.config), next_sentence=nsp)
            assert load_into(model, pretrained) == []
            mlm, nsp_logits = model.eval()(input_ids, token_type_ids, attention_mask)
            if not nsp:
                return {"logits": mlm}
            return {"prediction_logits": mlm, "seq_relationship_logits": nsp_logits}
        model = load_finetuned(str(hf_dir)).model
        out = model(input_ids, token_type_ids, attention_mask)
        if architecture == "BertForQuestionAnswering":
            return {"start_logits": out[0], "end_logits": out[1]}
        return {"logits": out}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_accepted_variant_gives_transformers_outputs(tmp_path, variant):
    architecture, options = VARIANTS[variant]
    hf_dir = write_hf_model(tmp_path / "hf", architecture, **options)
    config = load_pretrained(str(hf_dir)).config
    batch = random_batch(vocab=config["vocab_size"])
    if config["type_vocab_size"] == 1:
        batch = (batch[0], torch.zeros_like(batch[1]), batch[2])
    pooler = {"add_pooling_layer": False} if options.get("add_pooling_layer") is False else {}
    reference = reference_outputs(hf_dir, architecture, batch, **pooler)
    ours = our_outputs(hf_dir, architecture, batch)
    assert set(ours) == set(reference)
    real = batch[2].bool()
    for name, value in reference.items():
        if value.dim() >= 2 and value.shape[:2] == real.shape:  # per token: padded positions may differ
            torch.testing.assert_close(ours[name][real], value[real], atol=ATOL, rtol=0, msg=name)
        else:
            torch.testing.assert_close(ours[name], value, atol=ATOL, rtol=0, msg=name)
