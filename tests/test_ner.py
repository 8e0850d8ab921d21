"""CoNLL-2003 NER: entity F1 against seqeval, first-sub-token labels, the head against transformers, end-to-end runs
on the shared task's text format and the hub's columns, and bad input."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import transformers
from helpers.models import write_hf_bert
from helpers.ner_files import (
    NER_WORDS,
    ner_data_files,
    ner_sentences,
    read_conlleval,
    write_conll_text,
    write_hub_schema,
)
from helpers.predictions import predict
from helpers.runs import compose_config
from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities

from lightbert import train
from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.data.tokenizer import train_wordpiece
from lightbert.errors import UserError
from lightbert.model import BertConfig, BertForTokenClassification
from lightbert.tasks.ner.data import CONLL2003_LABELS, encode_sentences, read_conll_text
from lightbert.tasks.ner.metrics import NO_TAG, EntityF1, WordAccuracy, entities, entity_scores


@pytest.fixture(scope="module")
def ner_bert(tmp_path_factory):
    """A random 4-layer BERT whose vocabulary knows the test sentences' words."""
    return write_hf_bert(tmp_path_factory.mktemp("ner") / "bert", num_hidden_layers=4, words=NER_WORDS)


def by_position(found):
    return sorted(found, key=lambda e: (e[1], e[2], e[0]))


# (tags, the entities seqeval reads from them)
CRAFTED = [
    (["B-PER", "I-PER", "O"], [("PER", 0, 1)]),
    (["B-PER", "I-ORG", "O"], [("PER", 0, 0), ("ORG", 1, 1)]),  # the type changes inside: two entities
    (["O", "I-PER", "I-PER"], [("PER", 1, 2)]),  # nested I- without B- (IOB1): starts an entity
    (["I-PER", "I-PER", "B-PER"], [("PER", 0, 1), ("PER", 2, 2)]),  # IOB1: B- separates two of one type
    (["I-LOC", "O", "I-LOC"], [("LOC", 0, 0), ("LOC", 2, 2)]),
    (["B-MISC", "B-MISC", "I-MISC"], [("MISC", 0, 0), ("MISC", 1, 2)]),
    (["O", "O"], []),
    ([], []),
]


@pytest.mark.parametrize(("tags", "expected"), CRAFTED)
def test_entities_are_the_ones_seqeval_reads(tags, expected):
    assert by_position(entities(tags)) == by_position(expected)
    assert by_position(entities(tags)) == by_position(get_entities(tags))


@pytest.mark.parametrize(
    ("gold", "predicted", "f1"),
    [
        (["B-PER", "I-PER", "O"], ["B-ORG", "I-ORG", "O"], 0.0),  # right span, wrong type
        (["B-PER", "I-PER", "O"], ["B-PER", "O", "O"], 0.0),  # boundary off by one (too short)
        (["B-PER", "I-PER", "O"], ["B-PER", "I-PER", "I-PER"], 0.0),  # boundary off by one (too long)
        (["B-PER", "I-PER", "O"], ["I-PER", "I-PER", "O"], 1.0),  # I- without B- reads as the same entity
        (["B-PER", "O", "B-LOC"], ["B-PER", "O", "O"], 2 * (1.0 * 0.5) / 1.5),  # precision 1, recall 1/2
    ],
)
def test_entity_f1_on_crafted_cases_equals_seqeval(gold, predicted, f1):
    ours = entity_scores([gold], [predicted])
    assert ours["f1"] == pytest.approx(f1)
    assert ours["f1"] == pytest.approx(f1_score([gold], [predicted]))


@pytest.mark.parametrize("scheme", ["iob1", "bio"])
def test_entity_scores_equal_seqeval_on_random_sentences(scheme):
    rng = random.Random(0)
    gold = [tags for _, tags in ner_sentences(300, seed=3, scheme=scheme)]
    predicted = [[t if rng.random() < 0.8 else rng.choice(CONLL2003_LABELS) for t in tags] for tags in gold]
    ours = entity_scores(gold, predicted)
    assert ours["f1"] == pytest.approx(f1_score(gold, predicted), abs=1e-12)
    assert ours["precision"] == pytest.approx(precision_score(gold, predicted), abs=1e-12)
    assert ours["recall"] == pytest.approx(recall_score(gold, predicted), abs=1e-12)
    assert 0.3 < ours["f1"] < 0.95  # a mix of right and wrong, not a degenerate case


def test_entity_f1_metric_summed_over_batches_and_devices_equals_seqeval():
    rng = random.Random(1)
    gold = [tags for _, tags in ner_sentences(90, seed=4, scheme="iob1")]
    predicted = [[t if rng.random() < 0.8 else rng.choice(CONLL2003_LABELS) for t in tags] for tags in gold]

    def padded(rows, value):
        out = torch.full((len(rows), max(map(len, rows))), value)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor([CONLL2003_LABELS.index(t) for t in row])
        return out

    shards = [EntityF1(CONLL2003_LABELS) for _ in range(3)]  # three devices, batches of 7 sentences
    for start in range(0, len(gold), 7):
        shard = shards[(start // 7) % 3]
        shard.update(padded(predicted[start : start + 7], 0), padded(gold[start : start + 7], -100))
    for shard in shards[1:]:
        shards[0].merge_state(shard)  # what torchmetrics' sync does across processes
    scores = shards[0].compute()
    assert float(scores["f1"]) == pytest.approx(f1_score(gold, predicted), abs=1e-6)  # float32 tensors
    per_type = f1_score(gold, predicted, average=None)
    assert [float(scores[f"f1_{kind}"]) for kind in ("LOC", "MISC", "ORG", "PER")] == pytest.approx(per_type)


def test_labels_sit_on_each_word_s_first_sub_token():
    tokenizer = train_wordpiece(["the river team played music"] * 20, vocab_size=40)  # long words split up
    words = [["rivers", "the", "teammusic", "x"]]
    tags = [["B-LOC", "O", "B-ORG", "I-ORG"]]
    rows, cut = encode_sentences(words, tags, tokenizer, CONLL2003_LABELS, max_seq_length=64)
    assert cut == 0
    pieces = [tokenizer.backend.encode(w, add_special_tokens=False).tokens for w in words[0]]
    assert any(len(p) > 1 for p in pieces)  # the test needs a word of several sub-tokens
    starts = np.cumsum([1] + [len(p) for p in pieces[:-1]]).tolist()  # [CLS] first
    assert rows["word_starts"][0] == starts
    labels = rows["labels"][0]
    assert len(labels) == len(rows["input_ids"][0]) == sum(map(len, pieces)) + 2
    assert [labels[s] for s in starts] == [CONLL2003_LABELS.index(t) for t in tags[0]]
    assert sum(label != -100 for label in labels) == len(words[0])  # nothing else is labelled
    # Cut to 4 sub-tokens: the words that no longer start inside get no position, but keep their gold label.
    rows, cut = encode_sentences(words, tags, tokenizer, CONLL2003_LABELS, max_seq_length=6)
    assert cut == 1 and len(rows["input_ids"][0]) == 6
    assert [s for s in rows["word_starts"][0] if s >= 0] == [s for s in starts if s < 5]
    assert rows["word_starts"][0][-1] == -1 and len(rows["word_labels"][0]) == 4


def test_conll_text_reader(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP I-PER\n"
        "-DOCSTART- -X- -X- O\nBlackburn NNP B-NP I-PER\n"
    )
    data = read_conll_text(path, "f")
    assert data["tokens"] == [["EU", "rejects"], ["Peter"], ["Blackburn"]]
    assert data["ner_tags"] == [["I-ORG", "O"], ["I-PER"], ["I-PER"]]
    path.write_text("EU I-ORG\nrejects\n")
    with pytest.raises(UserError, match="line 2: 'rejects' has no tag column"):
        read_conll_text(path, "f")
    path.write_bytes("M\xfcller I-PER\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        read_conll_text(path, "f")
    path.write_text("-DOCSTART- -X- -X- O\n\n")
    with pytest.raises(UserError, match="holds no sentences"):
        read_conll_text(path, "f")


def test_token_classification_head_equals_transformers(tmp_path):
    hf_dir = write_hf_bert(tmp_path / "base")
    torch.manual_seed(0)
    config = transformers.BertConfig.from_pretrained(hf_dir, num_labels=9)
    reference = transformers.BertForTokenClassification(config).eval()
    reference.save_pretrained(tmp_path / "ner")
    ours = BertForTokenClassification(BertConfig.from_dict(load_pretrained(str(tmp_path / "ner")).config), 9)
    assert load_into(ours, load_pretrained(str(tmp_path / "ner"))) == []  # the head loads one-to-one
    ours.eval()
    input_ids = torch.randint(5, config.vocab_size, (3, 11))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        got = ours(input_ids, torch.zeros_like(input_ids), attention_mask)
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def ner_overrides(bert, files, *extra):
    return [
        "task=conll2003",
        f"init_from={bert}",
        "logger=csv",
        "trainer.max_steps=-1",
        "task.batch_size=8",
        *(f"task.data_files.{k}={v}" for k, v in files.items()),
        *extra,
    ]


@pytest.mark.slow
def test_fine_tuning_on_iob1_conll_files_learns_and_writes_conlleval_predictions(tmp_path, ner_bert):
    files = ner_data_files(tmp_path / "data", fmt="conll", scheme="iob1")
    cfg = compose_config(ner_overrides(ner_bert, files, "trainer.max_epochs=8", "optim.lr=1e-3"), tmp_path / "run")
    results = train(cfg)
    assert results["monitor"] == "val/f1"
    assert results["best_score"] > 0.6  # from 0: the tags depend on the words (measured: 0.96)
    eval_json = json.loads((tmp_path / "run" / "predictions" / "eval.json").read_text())
    for split in ("validation", "test"):
        sentences = read_conlleval(tmp_path / "run" / "predictions" / f"{split}.txt")
        source = read_conll_text(files[split], split)
        assert [[w for w, _, _ in s] for s in sentences] == source["tokens"]  # every word, in order
        assert [[g for _, g, _ in s] for s in sentences] == source["ner_tags"]
        gold = [[g for _, g, _ in s] for s in sentences]
        predicted = [[p for _, _, p in s] for s in sentences]
        assert eval_json[split]["f1"] == pytest.approx(f1_score(gold, predicted))
    # The predictions come from the best checkpoint: the dev F1 written is the best one logged.
    assert eval_json["validation"]["f1"] == pytest.approx(results["best_score"], abs=1e-6)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_fine_tuning_on_the_hub_schema(tmp_path, ner_bert, fmt):
    files = ner_data_files(tmp_path / "data", fmt=fmt, sizes=(24, 8, 8))
    results = train(compose_config(ner_overrides(ner_bert, files, "trainer.max_steps=3"), tmp_path / "run"))
    assert results["global_step"] == 3 and "val/f1" in results["metrics"]
    assert {p.rsplit("/", 1)[-1] for p in results["predictions"]} == {"validation.txt", "test.txt", "eval.json"}


def test_bad_ner_data_is_named(tmp_path, ner_bert):
    good = ner_sentences(6, seed=1)
    files = {"train": write_conll_text(tmp_path / "train.txt", good)}
    files["validation"] = write_conll_text(tmp_path / "dev.txt", [(["Paris"], ["B-CITY"])])
    with pytest.raises(UserError, match=r"validation.*unknown tag 'B-CITY'.*task.label_names"):
        train(compose_config(ner_overrides(ner_bert, files), tmp_path / "run1"))
    files["validation"] = tmp_path / "dev.jsonl"
    files["validation"].write_text(json.dumps({"tokens": ["a", "b"], "ner_tags": [0]}) + "\n")
    with pytest.raises(UserError, match="2 tokens but 1 tags"):
        train(compose_config(ner_overrides(ner_bert, files), tmp_path / "run2"))
    files["validation"] = write_hub_schema(tmp_path / "dev.parquet", good)
    files["validation"].write_bytes(b"")  # an empty file in a table format
    with pytest.raises(UserError, match="could not read"):
        train(compose_config(ner_overrides(ner_bert, files), tmp_path / "run3"))
    with pytest.raises(UserError, match=r"task.data_files.validation=PATH"):
        train(compose_config(ner_overrides(ner_bert, {"train": files["train"]}), tmp_path / "run4"))


# Part-of-speech tags (task=pos_tagging): a tag set without "O", scored by word accuracy alone.
POS_OF = {"the": "DT", "this": "DT", "of": "IN", "in": "IN", "for": "IN", "on": "IN", "by": "IN", "with": "IN",
          "and": "CC", "to": "TO", "was": "VBD", "were": "VBD", "are": "VBP", "his": "PRP$", "her": "PRP$",
          "which": "WDT", "paris": "NNP", "germany": "NNP", "reuters": "NNP", "mary": "NNP", "anna": "NNP"}  # fmt: skip


def pos_sentences(num_sentences: int, seed: int, length=(3, 9)) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    words = [[rng.choice(sorted(POS_OF)) for _ in range(rng.randint(*length))] + ["."] for _ in range(num_sentences)]
    return [(w, [POS_OF.get(x, ".") for x in w]) for w in words]


def test_word_accuracy_metric_counts_real_words_over_batches():
    metric = WordAccuracy()
    metric.update(torch.tensor([[1, 2, NO_TAG], [0, 0, 0]]), torch.tensor([[1, 3, 4], [0, -100, -100]]))
    metric.update(torch.tensor([[5]]), torch.tensor([[5]]))
    assert metric.compute()["word_accuracy"].item() == pytest.approx(3 / 5)  # 1, 0 and 5 right; NO_TAG wrong


def test_pos_tagging_is_scored_by_word_accuracy_and_a_cut_word_counts_wrong(tmp_path, ner_bert):
    files = {"train": write_conll_text(tmp_path / "train.txt", pos_sentences(120, seed=1))}
    long = pos_sentences(1, seed=3, length=(40, 40))  # cut at task.max_seq_length=32: 9 words have no prediction
    files["validation"] = write_conll_text(tmp_path / "dev.txt", pos_sentences(30, seed=2) + long)
    overrides = ner_overrides(ner_bert, files, "task=pos_tagging", "trainer.max_epochs=6", "optim.lr=1e-3")
    results = train(compose_config([*overrides, "task.max_seq_length=32"], tmp_path / "run"))
    assert results["monitor"] == "val/word_accuracy" and not any("f1" in k for k in results["metrics"])
    assert results["best_score"] > 0.8  # the tag is the word's (measured: 0.95)
    eval_json = json.loads((tmp_path / "run" / "predictions" / "eval.json").read_text())
    sentences = read_conlleval(tmp_path / "run" / "predictions" / "validation.txt")
    assert [p for _, _, p in sentences[-1][30:]] == ["_"] * 11  # the words cut off: no tag, counted wrong
    pairs = [(g, p) for s in sentences for _, g, p in s]
    assert eval_json == {"validation": {"word_accuracy": pytest.approx(sum(g == p for g, p in pairs) / len(pairs))}}
    assert eval_json["validation"]["word_accuracy"] == pytest.approx(results["best_score"], abs=1e-6)
    # predict.py tags new sentences as the run's evaluation did: the same tags, none for a word cut off
    predicted = predict(tmp_path / "run", [{"words": w} for w, _ in [*pos_sentences(3, seed=2), *long]], tmp_path)
    assert [p["tags"] for p in predicted[:3]] == [[p for _, _, p in s] for s in sentences[:3]]
    assert predicted[3]["tags"][30:] == [None] * 11 and "entities" not in predicted[3]
    with pytest.raises(UserError, match=r"task=pos_tagging reads local files: task.data_files.train=PATH"):
        train(compose_config([o for o in overrides if "data_files" not in o], tmp_path / "run2"))


def test_token_classification_with_a_bilstm_trains_and_predicts(tmp_path, ner_bert):
    """Table 5's + BiLSTM row for a token-level task: a fresh BiLSTM between the encoder and the tag layer."""
    files = ner_data_files(tmp_path / "data", sizes=(24, 8, 8))
    results = train(compose_config(ner_overrides(ner_bert, files, "trainer.max_steps=3", "task.module.bilstm=true"),
                                   tmp_path / "run"))  # fmt: skip
    assert results["global_step"] == 3 and "val/f1" in results["metrics"]
    weights = torch.load(results["best_checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
    assert any(".bilstm." in name for name in weights)
    assert len(predict(tmp_path / "run", [{"words": ["paris", "and", "mary"]}], tmp_path)[0]["tags"]) == 3
