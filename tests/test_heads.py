"""The head registry: every head's record agrees with its module, checkpoints name their head, and a new head
registered from outside the package (here, this file alone), with a setting of its own, trains, evaluates, predicts
and exports to Hugging Face."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.glue_files import glue_data_files
from helpers.models import write_hf_bert
from helpers.runs import compose_config
from torch import nn

from lightbert import evaluate, train
from lightbert.data.encoding import encode_pair
from lightbert.errors import UserError
from lightbert.inference.predict import predict_records
from lightbert.interop.convert import to_hf
from lightbert.model import BertConfig, BertModel
from lightbert.model.bert import init_weights
from lightbert.tasks.finetuned import load_finetuned
from lightbert.tasks.glue.module import SequenceClassificationModule
from lightbert.tasks.glue.predictor import SequenceClassification
from lightbert.tasks.heads import HEADS, Head, HeadArguments, register


def test_every_record_names_its_module_and_a_distinct_hugging_face_class():
    assert set(HEADS) == {
        "sequence_classification", "question_answering", "token_classification", "multiple_choice", "embedding",
    }  # fmt: skip
    for name, head in HEADS.items():
        assert head.module.head == name
        assert hasattr(transformers, head.hf_class)
    assert len({h.hf_class for h in HEADS.values()}) == len(HEADS)


FAMILY_HEAD = """
from lightbert.tasks.glue.module import SequenceClassificationModule
from lightbert.tasks.glue.predictor import SequenceClassification
from lightbert.tasks.heads import Head, HeadArguments, register
from lightbert.model import BertForSequenceClassification


class ToyModule(SequenceClassificationModule):
    head = "toy_classification"


register(
    Head(
        "toy_classification",
        ToyModule,
        lambda config, a: BertForSequenceClassification(config, 2),
        "BertForSequenceClassification",
        SequenceClassification,
        arguments=lambda hp: HeadArguments(("no", "yes")),
        defaults={"max_seq_length": 128, "window": 7},
        recorded_extra=lambda task, run_dir: {"tuned": float((run_dir / "tuned.txt").read_text())},
    )
)
"""


def test_a_family_folder_registers_its_head_with_nothing_edited_elsewhere(tmp_path, monkeypatch):
    """A new family is its folder (here `toyfamily/`, on lightbert.tasks' package path) with a `head.py`: the
    registry finds it at its first lookup, and reads the settings the family's runs record, its own included."""
    import sys

    import lightbert.tasks
    from lightbert.tasks.heads import HeadRegistry

    family = tmp_path / "toyfamily"
    family.mkdir()
    (family / "__init__.py").write_text("")
    (family / "head.py").write_text(FAMILY_HEAD)
    monkeypatch.setattr(lightbert.tasks, "__path__", [*lightbert.tasks.__path__, str(tmp_path)])
    monkeypatch.setattr(HeadRegistry, "_found", False)  # as in a fresh process, which looks the families up once
    try:
        head = HEADS["toy_classification"]
        assert head.module.__module__ == "lightbert.tasks.toyfamily.head"
        assert {"sequence_classification", "question_answering", "toy_classification"} <= set(HEADS)
        (tmp_path / "tuned.txt").write_text("0.25")
        recorded = head.recorded_settings({"window": "9", "name": "toy"}, tmp_path)
        assert recorded == {"window": 9, "tuned": 0.25}  # of the defaults' types; max_seq_length not recorded
    finally:
        dict.pop(HEADS, "toy_classification", None)
        for name in [m for m in sys.modules if m.startswith("lightbert.tasks.toyfamily")]:
            del sys.modules[name]


def test_a_module_that_names_another_head_is_refused_at_registration():
    class Mislabelled(SequenceClassificationModule):
        head = "something_else"

    with pytest.raises(TypeError, match="Mislabelled.head is 'something_else'"):
        register(Head("mislabelled", Mislabelled, lambda c, a: nn.Identity(), "BertModel", SequenceClassification))


# -- a head of one's own: BERT's next-sentence classifier as a fine-tuned head ------------------------------------


class BertForNextSentence(nn.Module):
    """The pooled [CLS] vector into the two-way next-sentence classifier, with Hugging Face's
    `BertForNextSentencePrediction` parameter names: a head the package does not ship."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.bert = BertModel(config)
        self.cls = nn.Module()
        self.cls.seq_relationship = nn.Linear(config.hidden_size, 2)
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        _, pooled_output, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self.cls.seq_relationship(pooled_output)  # (B, 2)


class NextSentenceModule(SequenceClassificationModule):
    head = "next_sentence"

    def __init__(self, model: dict, optim: dict, task: str, bilstm: bool = False):
        super().__init__(model, optim, task, bilstm)
        self.model = BertForNextSentence(self.config)


def _arguments(hp: dict) -> HeadArguments:
    return HEADS["sequence_classification"].arguments(hp)


NEXT_SENTENCE = Head(
    "next_sentence",
    NextSentenceModule,
    lambda config, arguments: BertForNextSentence(config),
    "BertForNextSentencePrediction",
    SequenceClassification,
    arguments=_arguments,
    labelled=True,
    reads_cls=True,
    # A setting of its own, which its runs record (task.pair_weight) and a fine-tuned model of it reads back.
    defaults={"max_seq_length": 128, "pair_weight": 1.0},
)


@pytest.mark.slow
def test_a_head_registered_from_outside_trains_evaluates_predicts_and_exports(tmp_path, monkeypatch):
    monkeypatch.setitem(HEADS, "next_sentence", NEXT_SENTENCE)  # what register() does, undone after the test
    files = glue_data_files(tmp_path / "data", "mrpc", "jsonl", num_rows=32)
    bert = write_hf_bert(tmp_path / "bert")
    overrides = [
        "task=glue/mrpc",
        f"task.module._target_={__name__}.NextSentenceModule",
        f"init_from={bert}",
        "trainer=cpu",
        "logger=csv",
        "task.batch_size=8",
        "task.max_seq_length=32",
        "task.datamodule.num_workers=0",
        "trainer.max_epochs=1",
        "+task.pair_weight=0.5",
        *(f"task.data_files.{split}={path}" for split, path in files.items()),
    ]
    results = train(compose_config(overrides, tmp_path / "run"))
    checkpoint = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=True)
    assert checkpoint["head"] == "next_sentence"

    finetuned = load_finetuned(str(tmp_path / "run"))
    assert finetuned.head == "next_sentence" and isinstance(finetuned.model, BertForNextSentence)
    assert finetuned.labels == ("not_equivalent", "equivalent") and finetuned.task == "mrpc"
    assert finetuned.settings == {"max_seq_length": 32, "pair_weight": 0.5}  # as its run recorded them

    scored = evaluate(
        compose_config(
            [o for o in overrides if not o.startswith(("init_from=", "trainer.max_epochs", "+task."))]
            + [f"init_from={tmp_path / 'run'}"],
            tmp_path / "eval",
            config_name="evaluate",
        )
    )
    assert scored["metrics"]["val/score"] == pytest.approx(results["best_score"], abs=1e-6)

    records = [(1, {"text": "the river city", "text_pair": "the river team"}), (2, {"text": "music film"})]
    predicted, _ = predict_records(finetuned, records)
    assert [set(p) for p in predicted.predictions] == [{"label", "probabilities"}] * 2

    exported = to_hf(str(tmp_path / "run"), str(tmp_path / "hf"))
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["BertForNextSentencePrediction"]
    theirs = transformers.BertForNextSentencePrediction.from_pretrained(exported).eval()
    tokenizer = finetuned.tokenizer
    a, b = tokenizer.encode_batch(["the river city", "the river team"])
    input_ids, token_type_ids = encode_pair(a, b, tokenizer.cls_id, tokenizer.sep_id)
    ids, types = torch.tensor([input_ids]), torch.tensor([token_type_ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ours = finetuned.model(ids, types, mask)
        reference = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


def test_a_checkpoint_from_before_heads_were_recorded_says_so(sst2_run, tmp_path):
    checkpoint = torch.load(sst2_run.results["best_checkpoint"], map_location="cpu", weights_only=True)
    assert checkpoint.pop("head") == "sequence_classification"
    old = tmp_path / "checkpoints" / "old.ckpt"
    old.parent.mkdir()
    torch.save(checkpoint, old)
    (tmp_path / "tokenizer.json").write_bytes((sst2_run.dir / "tokenizer.json").read_bytes())
    with pytest.raises(UserError, match="does not record which head they are"):
        load_finetuned(str(old))
