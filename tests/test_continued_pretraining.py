"""Continued pre-training of a released BERT (docs/continued-pretraining.md): the run starts where transformers
stands on the same checkpoint, says what it carried, and grows the vocabulary by a domain's words
(`task.datamodule.add_words`) without changing what the old words gave."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.models import write_hf_bert, write_hf_model
from helpers.runs import TINY_PRETRAIN, compose_config, run_train_forked, write_bert_corpus
from hydra.utils import instantiate
from omegaconf import DictConfig

from lightbert import train
from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.data.encoding import IGNORE_INDEX
from lightbert.data.tokenizer import load_tokenizer
from lightbert.interop.convert import main as convert
from lightbert.model import BertConfig, BertForPreTraining
from lightbert.model.bert import padded_vocab
from lightbert.tasks.pretraining.continued import DECODER_BIAS, EMBEDDINGS, PAD_MULTIPLE, with_added_words
from lightbert.tasks.pretraining.domain_words import count_words, most_pieces, pieces_of, with_words
from lightbert.tasks.pretraining.module import PreTrainingModule

# The released checkpoint's own sizes; only the data's are set.
CONTINUED = [a for a in TINY_PRETRAIN if not a.startswith(("model=", "task.datamodule.vocab_size"))]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=24)


# -- parity at the start -----------------------------------------------------------------------------------------


def first_validation(init_from: Path, corpus: Path, run_dir: Path, caplog) -> tuple[dict, list[str], DictConfig]:
    """A continued run whose first validation measures the checkpoint as read: its first step has learning rate 0
    (a warm-up of one step starts at 0), and it validates after it on the whole held-out split (a quarter of the
    documents). Returns its results, the lines it said of init_from, and its config."""
    overrides = [
        *CONTINUED, f"init_from={init_from}", f"corpus.paths=[{corpus}]", "trainer.max_steps=1",
        "trainer.val_check_interval=1", "optim.warmup_steps=1", "task.datamodule.validation_share=null",
        "task.datamodule.validation_fraction=0.25",
    ]  # fmt: skip
    cfg = compose_config(overrides, run_dir)
    with caplog.at_level(logging.INFO, logger="lightbert"):
        results = train(cfg)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"init_from={init_from}:")]
    return results, said, cfg


def held_out_batches(cfg: DictConfig, init_from: Path) -> list[dict]:
    """The run's validation batches, rebuilt from its config: the same examples, the same masks."""
    datamodule = instantiate(cfg.task.datamodule, _partial_=True)(tokenizer=load_pretrained(str(init_from)).tokenizer)
    datamodule.prepare_data()
    datamodule.setup()
    return list(datamodule.val_dataloader())


def transformers_losses(model: transformers.BertForPreTraining, batches: list[dict]) -> tuple[float, float]:
    """Masked-LM loss per predicted token and NSP loss per sequence over all `batches`, from transformers' logits."""
    mlm, nsp = [], []
    with torch.no_grad():
        for batch in batches:
            out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            labels = batch["labels"]
            mlm.append(F.cross_entropy(out.prediction_logits[labels != IGNORE_INDEX], labels[labels != IGNORE_INDEX],
                                       reduction="none"))  # fmt: skip
            nsp.append(F.cross_entropy(out.seq_relationship_logits, batch["next_sentence_label"], reduction="none"))
    return float(torch.cat(mlm).mean()), float(torch.cat(nsp).mean())


@pytest.mark.parametrize("heads", [True, False], ids=["BertForPreTraining", "bare BertModel"])
def test_the_first_held_out_losses_equal_transformers_on_the_same_masked_batches(heads, corpus, tmp_path, caplog):
    """With heads, transformers reads the whole checkpoint as the run does. Without (a bare BertModel, as sentence
    encoders ship), both libraries start the MLM transform, the decoder bias and the NSP classifier fresh, each from
    its own random draws; so the run's fresh heads, as its checkpoint after the step of learning rate 0 holds them,
    are copied into transformers' model: the encoder, the pooler and the tied decoder are then still transformers'
    own reading of the checkpoint, and the losses must agree as closely as with heads."""
    init_from = write_hf_bert(tmp_path / "bert", bare_encoder=not heads)
    run_dir = tmp_path / "run"
    results, said, cfg = first_validation(init_from, corpus, run_dir, caplog)
    checkpoint = torch.load(results["last_checkpoint"], weights_only=True)["state_dict"]
    hf = transformers.BertForPreTraining.from_pretrained(init_from).eval()
    reference = hf.state_dict()
    # The step of learning rate 0 left every weight as read: the validation measured the checkpoint itself.
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(checkpoint["model." + key], reference[key])
    fresh = ["cls.predictions.transform.dense.weight", "cls.predictions.bias", "cls.seq_relationship.weight"]
    if heads:
        assert all(torch.equal(checkpoint["model." + k], reference[k]) for k in fresh)
    else:
        drawn = [k for k in fresh if k.endswith("weight")]  # random in each (both start the bias at zero)
        assert not any(torch.equal(checkpoint["model." + k], reference[k]) for k in drawn)
        heads_of_the_run = {k[len("model.") :]: v for k, v in checkpoint.items() if k.startswith("model.cls.")}
        hf.load_state_dict(heads_of_the_run, strict=False)
    batches = held_out_batches(cfg, init_from)
    mlm, nsp = transformers_losses(hf, batches)
    assert sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches) >= 50
    assert results["metrics"]["val/mlm_loss"] == pytest.approx(mlm, abs=1e-5, rel=0)
    assert results["metrics"]["val/nsp_loss"] == pytest.approx(nsp, abs=1e-5, rel=0)
    # One line says what was carried and what starts fresh, counted.
    assert len(said) == 1, said
    if heads:
        assert "carried its encoder (37 tensors), pooler (2), MLM transform (4), MLM decoder bias (1) and NSP " \
               "classifier (2)" in said[0] and "fresh" not in said[0]  # fmt: skip
    else:
        assert "carried its encoder (37 tensors) and pooler (2); MLM transform (4 tensors), MLM decoder bias (1) and " \
               f"NSP classifier (2) start fresh: {init_from} has no pre-training heads" in said[0]  # fmt: skip


# -- domain words ------------------------------------------------------------------------------------------------


def test_words_are_ranked_by_the_tokens_they_would_save(tmp_path):
    tokenizer = load_pretrained(str(write_hf_bert(tmp_path / "bert"))).tokenizer
    counted = pieces_of(Counter({"riverfilm": 10, "citywar": 30, "the": 500, "zqxj": 40}), tokenizer)
    saved = dict(zip(counted.words, counted.counts * (counted.pieces - 1), strict=True))
    assert saved["the"] == 0 and saved["riverfilm"] > 0 and saved["citywar"] > 0  # "the" is one token already
    ranked = most_pieces(counted, 10)
    assert ranked == sorted(ranked, key=lambda w: (-saved[w], w)) and "the" not in ranked
    assert most_pieces(counted, 1) == ranked[:1] and most_pieces(counted, 0) == []
    # Words are found as the tokenizer finds them: lower-cased, split at punctuation.
    counts, documents = count_words([["The River-film, the RIVERFILM."], ["riverfilm"]], tokenizer)
    assert documents == 2 and counts["riverfilm"] == 2 and counts["river"] == 1 and counts["-"] == 1


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    return write_hf_bert(tmp_path_factory.mktemp("released") / "bert")


def test_old_words_give_the_logits_they_gave_before_the_words_were_added(released):
    pretrained = load_pretrained(str(released))
    old = pretrained.tokenizer
    words = ["riverfilm", "citywar", "albumhouse"]
    extended = with_words(old, words)
    assert [extended.backend.token_to_id(w) for w in words] == list(range(old.vocab_size, old.vocab_size + 3))
    grown, growth = with_added_words(pretrained, extended)
    rows = grown.config["vocab_size"]
    assert rows == extended.vocab_size and growth.words == 3  # the checkpoint's rows: the tokenizer's
    before, after = (
        BertForPreTraining(BertConfig.from_dict(pretrained.config)),
        BertForPreTraining(BertConfig.from_dict(grown.config)),
    )
    assert load_into(before, pretrained) == [] and load_into(after, grown) == []
    embeddings = after.bert.embeddings.word_embeddings.weight
    assert after.cls.predictions.decoder.weight is embeddings  # still tied
    for word in words:  # a new word starts as the mean of its old pieces, in the embeddings and the decoder's bias
        pieces, row = old.encode_batch([word])[0], extended.backend.token_to_id(word)
        assert len(pieces) > 1
        torch.testing.assert_close(embeddings[row], before.bert.embeddings.word_embeddings.weight[pieces].mean(0))
        torch.testing.assert_close(after.cls.predictions.bias[row], before.cls.predictions.bias[pieces].mean())
    assert embeddings.shape[0] == padded_vocab(rows) > rows  # the model pads its rows itself, with zeros
    assert not embeddings[rows:].any() and not after.cls.predictions.bias[rows:].any()
    assert after.state_dict()["bert.embeddings.word_embeddings.weight"].shape[0] == rows  # and never saves them
    text = "the city river was the first album of the new team"  # no added word in it
    ids = old.encode_batch([text])[0]
    assert extended.encode_batch([text])[0] == ids
    assert extended.encode_batch(["the riverfilm"])[0] == [old.backend.token_to_id("the"), extended.vocab_size - 3]
    input_ids = torch.tensor([[old.cls_id, *ids, old.sep_id]])
    with torch.no_grad():
        mlm_before, nsp_before = before.eval()(input_ids)
        mlm_after, nsp_after = after.eval()(input_ids)
    assert mlm_after.shape[-1] == rows  # no padding row predicted
    torch.testing.assert_close(mlm_after[..., : old.vocab_size], mlm_before[..., : old.vocab_size], atol=1e-5, rtol=0)
    torch.testing.assert_close(nsp_after, nsp_before, atol=1e-6, rtol=0)


def test_the_growth_line_counts_the_checkpoints_padding_rows(released):
    """Words added to a checkpoint of exactly its tokens grow it by the words (the model pads inside); added to one
    whose rows an earlier lightbert padded, they take its padding rows first, and the line counts what is left."""
    from dataclasses import replace

    pretrained = load_pretrained(str(released))
    old, rows = pretrained.tokenizer, pretrained.config["vocab_size"]
    assert rows == old.vocab_size and rows % PAD_MULTIPLE  # not a multiple of 64
    grown, growth = with_added_words(pretrained, with_words(old, ["riverfilm"]))
    assert grown.config["vocab_size"] == rows + 1
    assert str(growth) == (
        f"the word embeddings grow from {rows} to {rows + 1} rows: {rows} tokens of init_from and 1 added words"
    )
    padded_rows = padded_vocab(rows)  # as an earlier lightbert's growth left it: zero rows, decoder bias -10000
    embeddings, bias = pretrained.state_dict[EMBEDDINGS], pretrained.state_dict[DECODER_BIAS]
    state = {
        **pretrained.state_dict,
        EMBEDDINGS: torch.cat([embeddings, embeddings.new_zeros(padded_rows - rows, embeddings.shape[1])]),
        DECODER_BIAS: torch.cat([bias, bias.new_full((padded_rows - rows,), -1e4)]),
    }
    earlier = replace(pretrained, config={**pretrained.config, "vocab_size": padded_rows}, state_dict=state)
    _, again = with_added_words(earlier, with_words(old, ["riverfilm", "citywar", "albumhouse"]))
    assert str(again) == (
        f"the word embeddings keep their {padded_rows} rows: {rows} tokens of init_from and 3 added words, and "
        f"{padded_rows - rows - 3} padding rows of init_from's"
    )


def test_a_word_file_leaves_out_words_wordpiece_cannot_read_and_is_refused_empty(released, tmp_path, caplog):
    from lightbert.errors import UserError
    from lightbert.tasks.pretraining.domain_words import add_words

    tokenizer = load_pretrained(str(released)).tokenizer
    words = tmp_path / "words.txt"
    words.write_text("riverfilm\n\n" + "x" * 101 + "\ncitywar\nthe\n" + "y" * 100 + "\n")
    with caplog.at_level(logging.INFO, logger="lightbert"):
        extended = add_words(tokenizer, str(words), [], 0)
    added = [t for t, i in extended.backend.get_vocab().items() if i >= tokenizer.vocab_size]
    assert sorted(added) == sorted(["riverfilm", "citywar", "y" * 100])  # 100 characters: WordPiece reads it
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocabulary:")]
    assert len(said) == 1 and "3 words of" in said[0] and "1 of its words are one token already" in said[0]
    assert "1 of its words are longer than WordPiece reads (max_input_chars_per_word=100 characters" in said[0]
    assert extended.encode_batch(["y" * 100])[0] == [extended.backend.token_to_id("y" * 100)]
    words.write_text("\n  \n")
    with pytest.raises(UserError, match=r"add_words=.*words.txt holds no words \(2 blank line\(s\)\)"):
        add_words(tokenizer, str(words), [], 0)
    with pytest.raises(UserError, match=r"add_words=.* is a directory; give a file of words"):
        add_words(tokenizer, str(tmp_path), [], 0)


def test_a_run_that_added_words_to_a_tokenizer_path_resumes_with_them(released, corpus, tmp_path):
    """init_from without its tokenizer, task.datamodule.tokenizer_path giving it, and added words: on a resume the
    model reads the run's own tokenizer.json (the words added) against the checkpoint's tokenizer, as on the first
    start, so the embeddings grow by the same words (it was refused: the tokenizer path was read on a first start
    only, and the grown tokenizer then did not fit the checkpoint's rows)."""
    from helpers.runs import run_settings

    from lightbert.run.model_choice import vocabulary
    from lightbert.run.run_dir import Start

    bare = tmp_path / "no_tokenizer"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((released / name).read_bytes())
    run_dir = tmp_path / "run"
    given = [f"init_from={bare}", f"task.datamodule.tokenizer_path={released / 'vocab.txt'}"]
    settings = run_settings(
        compose_config(
            [*CONTINUED, f"corpus.paths=[{corpus}]", *given, "task.datamodule.add_words=3", "resume=true"], run_dir
        )
    )
    pretrained = load_pretrained(str(bare))
    words = ["riverfilm", "citywar", "albumhouse"]
    with_words(load_tokenizer(released / "vocab.txt"), words).save(run_dir / "tokenizer.json")  # the run's own
    resumed = Start(resume_from=run_dir / "checkpoints" / "last.ckpt", step=2)
    pretrained, tokenizer = vocabulary(settings, resumed, pretrained)
    assert tokenizer["add_words"] is None  # not added again
    grown, growth = with_added_words(pretrained, tokenizer["tokenizer"])
    assert growth is not None and growth.words == len(words)
    assert grown.config["vocab_size"] >= tokenizer["tokenizer"].vocab_size


@pytest.fixture(scope="module")
def extended_run(released, corpus, tmp_path_factory) -> dict:
    """A continued run that adds 20 words, stopped after step 2 as if cut short, then resumed to step 3: its
    directory and what each part said."""
    run_dir = tmp_path_factory.mktemp("extended") / "run"
    # add_words and the prediction slots as a user may write them: a float count once opened as a file, and a
    # quoted number, which reached the collator as text; 200 slots are more than a row of 64 tokens can use.
    base = [*CONTINUED, f"init_from={released}", f"corpus.paths=[{corpus}]", "task.datamodule.add_words=2e1",
            "task.datamodule.max_predictions_per_seq='200'", "trainer.max_steps=3", "trainer.val_check_interval=1",
            "task.checkpoint_every_n_steps=1"]  # fmt: skip
    first = run_train_forked(
        *base, f"hydra.run.dir={run_dir}", "+callbacks.stop._target_=helpers.loss_recorder.StopAtStep",
        "+callbacks.stop.step=2", PYTHONPATH=str(Path(__file__).parent),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    tokenizer = (run_dir / "tokenizer.json").read_bytes()
    (run_dir / "results.json").unlink()  # as if it had stopped after its checkpoint of step 2
    resumed = run_train_forked(*base, f"hydra.run.dir={run_dir}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"dir": run_dir, "tokenizer": tokenizer, "first": first.stdout + first.stderr,
            "resumed": resumed.stdout + resumed.stderr}  # fmt: skip


def test_a_continued_run_adds_the_words_and_says_so_once(extended_run, released):
    console = extended_run["first"]
    assert console.count("words of the corpus added to init_from's") == 1
    assert "20 words of the corpus added" in console and "pieces per word there" in console
    assert console.count(f"init_from={released}: carried its encoder") == 1
    assert "the word embeddings grow from" in console and "20 added words" in console
    capped = "task.datamodule.max_predictions_per_seq=200 is more than a row of 64 tokens can use (at most 9 "
    assert console.count(capped) == 1 and "12 prediction slots, as null gives" in console


def test_resume_keeps_the_extended_vocabulary(extended_run):
    run_dir = extended_run["dir"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 3
    assert (run_dir / "tokenizer.json").read_bytes() == extended_run["tokenizer"]  # the same words, the same ids
    assert "words of the corpus added" not in extended_run["resumed"]  # none counted or added again
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    module = PreTrainingModule.load_from_checkpoint(results["last_checkpoint"], weights_only=True)
    assert module.config.vocab_size == tokenizer.vocab_size
    assert tokenizer.vocab_size == load_pretrained(str(run_dir)).tokenizer.vocab_size


def test_the_extended_model_exports_to_transformers_whose_model_and_tokenizer_agree(extended_run, released, tmp_path):
    run_dir, out = extended_run["dir"], tmp_path / "hf"
    assert convert(["to-hf", str(run_dir), str(out)]) == 0
    pretrained = load_pretrained(str(run_dir))
    added = [t for t, i in pretrained.tokenizer.backend.get_vocab().items()
             if i >= load_pretrained(str(released)).tokenizer.vocab_size]  # fmt: skip
    assert len(added) == 20
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = f"The {added[0]} was {added[1]}s of the city, {added[2].upper()}."
    ours_ids = pretrained.tokenizer.encode_batch([text])[0]
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ours_ids
    assert {pretrained.tokenizer.backend.token_to_id(w) for w in added[:3]} <= set(ours_ids)
    hf = transformers.BertForMaskedLM.from_pretrained(out).eval()
    assert hf.config.vocab_size == pretrained.config["vocab_size"]
    ours = BertForPreTraining(BertConfig.from_dict(pretrained.config))
    assert load_into(ours, pretrained) == []
    encoded = hf_tokenizer([text, "the river"], padding=True, return_tensors="pt")
    with torch.no_grad():
        mlm, _ = ours.eval()(encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"])
        reference = hf(**encoded).logits
    real = encoded["attention_mask"].bool()
    torch.testing.assert_close(mlm[real], reference[real], atol=1e-5, rtol=0)


# -- refused before anything is written, in one line ------------------------------------------------------------


def bad_inputs(released: Path, tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each bad input: its overrides, and what its one line must say."""
    untied = write_hf_model(tmp_path / "untied", tie_word_embeddings=False)
    bare = tmp_path / "no_tokenizer"  # a checkpoint without its tokenizer, read with a bigger vocabulary
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((released / name).read_bytes())
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    rows = load_pretrained(str(released)).config["vocab_size"]
    words = (released / "vocab.txt").read_text().splitlines()
    (tmp_path / "big_vocab.txt").write_text("\n".join([*words, *(f"extra{i}" for i in range(rows + 8 - len(words)))]))
    return {
        "untied decoder": ([f"init_from={untied}", "task.datamodule.add_words=10"],
                           "task.datamodule.add_words extends the word embeddings and the MLM decoder tied to them"),
        "missing word file": ([f"init_from={released}", f"task.datamodule.add_words={tmp_path / 'words.txt'}"],
                              "task.datamodule.add_words"),
        "count below 0": ([f"init_from={released}", "task.datamodule.add_words=-3"],
                          "task.datamodule.add_words must be a count of words (0 or more) or a file of words, got -3"),
        "count not whole": ([f"init_from={released}", "task.datamodule.add_words=10.5"],
                            "task.datamodule.add_words must be a count of words (0 or more) or a file of words, got "
                            "10.5"),
        "a directory as word file": ([f"init_from={released}", f"task.datamodule.add_words={released}"],
                                     f"task.datamodule.add_words={released} is a directory; give a file of words"),
        "an empty word file": ([f"init_from={released}", f"task.datamodule.add_words={empty}"],
                               f"task.datamodule.add_words={empty} holds no words"),
        "add_words in a phase": ([f"init_from={released}", "trainer.max_steps=4",
                                  "task.phases=[{until:0.5,datamodule:{add_words:10}},{until:1.0,datamodule:{}}]"],
                                 "task.phases[0].datamodule.add_words: a phase cannot change it; the words are added "
                                 "once, before the first phase: set task.datamodule.add_words"),
        "a value the second phase's data refuses": (
            [f"init_from={released}", "trainer.max_steps=4",
             "task.phases=[{until:0.5,datamodule:{max_seq_length:32}},{until:1.0,datamodule:{masked_lm_prob:1.5}}]"],
            "task.phases[1] {'masked_lm_prob': 1.5}: task.datamodule.masked_lm_prob must be in (0, 1), got 1.5"),
        "bad slots in the second phase": ([f"init_from={released}", "trainer.max_steps=4",
                                           "task.phases=[{until:0.5,datamodule:{max_seq_length:32}},"
                                           "{until:1.0,datamodule:{max_predictions_per_seq:'x'}}]"],
                                          "task.phases[1].datamodule.max_predictions_per_seq must be an integer, got "
                                          "'x'"),
        "tokenizer of another size": (
            [f"init_from={bare}", f"task.datamodule.tokenizer_path={tmp_path / 'big_vocab.txt'}",
             "task.datamodule.add_words=10"],
            f"the tokenizer has {rows + 8} tokens but init_from={bare} embeds only {rows}"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "untied decoder", "missing word file", "count below 0", "tokenizer of another size", "count not whole",
        "a directory as word file", "an empty word file", "add_words in a phase", "bad slots in the second phase",
        "a value the second phase's data refuses",
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(case, released, corpus, tmp_path):
    overrides, says = bad_inputs(released, tmp_path)[case]
    run_dir = tmp_path / "run"
    done = run_train_forked(*CONTINUED, f"corpus.paths=[{corpus}]", *overrides, f"hydra.run.dir={run_dir}")
    console = done.stdout + done.stderr
    assert done.returncode == 2, console[-3000:]
    assert "Traceback" not in console, console[-3000:]
    errors = [line for line in console.splitlines() if line.startswith("lightbert: error: ")]
    assert len(errors) == 1 and says in errors[0], console[-3000:]
    assert not run_dir.exists() or not any(run_dir.iterdir())  # nothing written: no .hydra/, no train.log


def test_evaluate_refuses_add_words_copied_from_the_training_command(extended_run, corpus, tmp_path):
    """`src/evaluate.py task=pretrain init_from=<a continued run> task.datamodule.add_words=40`, copied from the
    training command, added 40 more words and scored the checkpoint with fresh rows (MLM accuracy 0.060 -> 0.018)."""
    from helpers.runs import run_script_forked

    run_dir = tmp_path / "eval"
    done = run_script_forked(
        "evaluate", *CONTINUED, f"corpus.paths=[{corpus}]", f"init_from={extended_run['dir']}",
        "task.datamodule.add_words=40", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    console = done.stdout + done.stderr
    errors = [line for line in console.splitlines() if line.startswith("lightbert: error: ")]
    assert done.returncode == 2 and "Traceback" not in console, console[-3000:]
    assert len(errors) == 1 and "task.datamodule.add_words=40 belongs to training" in errors[0], console[-3000:]
    assert not run_dir.exists() or not any(run_dir.iterdir())
