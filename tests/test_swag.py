"""SWAG: the multiple-choice head against transformers, the four (context, ending) pairs, an end-to-end run that
learns, and bad input."""

from __future__ import annotations

import math

import datasets
import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.models import write_hf_bert
from helpers.runs import compose_config
from helpers.swag_files import ACTIONS, SUBJECTS, swag_data_files, swag_rows, write_swag_file

from lightbert import train
from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.data.tokenizer import load_tokenizer
from lightbert.errors import UserError
from lightbert.model import BertConfig, BertForMultipleChoice
from lightbert.tasks.swag.data import ChoiceCollator, encode_choices
from lightbert.tasks.swag.module import MultipleChoiceModule

SWAG_WORDS = " ".join(SUBJECTS + ACTIONS).split()


@pytest.fixture(scope="module")
def swag_bert(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("swag") / "bert", words=SWAG_WORDS)


def test_multiple_choice_head_equals_transformers(tmp_path):
    base = write_hf_bert(tmp_path / "base")
    torch.manual_seed(0)
    reference = transformers.BertForMultipleChoice(transformers.BertConfig.from_pretrained(base)).eval()
    reference.save_pretrained(tmp_path / "mc")
    pretrained = load_pretrained(str(tmp_path / "mc"))
    ours = BertForMultipleChoice(BertConfig.from_dict(pretrained.config))
    assert load_into(ours, pretrained) == []  # the head loads one-to-one
    ours.eval()
    input_ids = torch.randint(5, 100, (3, 4, 10))
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., 5:] = 1
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 2, 7:] = 0
    labels = torch.tensor([0, 3, 1])
    with torch.no_grad():
        expected = reference(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels
        )
        got = ours(input_ids, token_type_ids, attention_mask)
    torch.testing.assert_close(got, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(F.cross_entropy(got, labels), expected.loss, atol=1e-5, rtol=1e-5)


def test_each_choice_is_the_context_then_its_continuation(swag_bert):
    tokenizer = load_tokenizer(swag_bert / "vocab.txt")
    rows = swag_rows(3, seed=5)
    encoded = encode_choices(rows, tokenizer, max_seq_length=64)
    for i in range(3):
        context = tokenizer.encode_batch([rows["sent1"][i]])[0]
        for choice in range(4):
            ending = tokenizer.encode_batch([f"{rows['sent2'][i]} {rows[f'ending{choice}'][i]}"])[0]
            ids = encoded["input_ids"][i][choice]
            assert ids == [tokenizer.cls_id, *context, tokenizer.sep_id, *ending, tokenizer.sep_id]
            assert encoded["token_type_ids"][i][choice] == [0] * (len(context) + 2) + [1] * (len(ending) + 1)
    short = encode_choices(rows, tokenizer, max_seq_length=9)
    assert all(len(ids) <= 9 for example in short["input_ids"] for ids in example)
    batch = ChoiceCollator(tokenizer.pad_id, 8)(
        [{**{k: v[i] for k, v in encoded.items()}, "label": rows["label"][i], "idx": i} for i in range(3)]
    )
    assert batch["input_ids"].shape[:2] == (3, 4) and batch["input_ids"].shape[2] % 8 == 0
    assert batch["attention_mask"][1, 2].sum() == len(encoded["input_ids"][1][2])
    assert batch["labels"].tolist() == rows["label"]


@pytest.mark.slow
def test_swag_fine_tuning_on_local_csv_files_learns(tmp_path, swag_bert):
    files = swag_data_files(tmp_path / "data", "csv", sizes=(320, 80))
    overrides = [
        "task=swag",
        f"init_from={swag_bert}",
        "logger=csv",
        "trainer.max_epochs=8",
        "trainer.max_steps=-1",
        "optim.lr=1e-3",
        *(f"task.data_files.{k}={v}" for k, v in files.items()),
    ]
    results = train(compose_config(overrides, tmp_path / "run"))
    assert results["monitor"] == "val/accuracy"
    # Chance is a loss of ln 4 = 1.386 and accuracy 0.25; the right ending repeats the context's action.
    assert results["metrics"]["val/loss"] < math.log(4) - 0.2  # measured: 0.66 after 10 epochs
    assert results["best_score"] > 0.35
    module = MultipleChoiceModule.load_from_checkpoint(results["best_checkpoint"])
    assert isinstance(module.model, BertForMultipleChoice)


def test_swag_bad_input_is_named(tmp_path, swag_bert):
    files = swag_data_files(tmp_path / "data", "jsonl", sizes=(8, 4))
    overrides = ["task=swag", f"init_from={swag_bert}", "logger=csv", "trainer.max_steps=1"]
    bad = write_swag_file(tmp_path / "bad.parquet", 4)
    dataset = datasets.Dataset.from_parquet(str(bad))
    dataset.remove_columns(["ending3"]).to_parquet(str(bad))
    with pytest.raises(UserError, match=r"lacks the column\(s\) \['ending3'\]"):
        train(
            compose_config(
                [*overrides, f"task.data_files.train={files['train']}", f"task.data_files.validation={bad}"],
                tmp_path / "run1",
            )
        )
    dataset.map(lambda row: {"label": 4}).to_parquet(str(bad))
    with pytest.raises(UserError, match="label must be 0-3"):
        train(
            compose_config(
                [*overrides, f"task.data_files.train={files['train']}", f"task.data_files.validation={bad}"],
                tmp_path / "run2",
            )
        )
    with pytest.raises(UserError, match="task=swag fine-tunes a pre-trained model: set init_from"):
        train(
            compose_config(
                ["task=swag", "logger=csv", *(f"task.data_files.{k}={v}" for k, v in files.items())], tmp_path / "run3"
            )
        )
