"""Streaming pre-training data: every reader its own documents, endless passes, exact fast-forward on resume."""

import json
from itertools import islice

import pytest
from helpers.runs import compose_config, write_bert_corpus

from lightbert.data.tokenizer import iter_sentences, train_wordpiece
from lightbert.errors import UserError
from lightbert.pretraining.corpus import TextCorpus, read_bert_format
from lightbert.pretraining.streaming import StreamingExamples
from lightbert.run.jobs import train


@pytest.fixture(scope="module")
def corpus_and_tokenizer(tmp_path_factory):
    path = write_bert_corpus(tmp_path_factory.mktemp("stream") / "corpus.txt", num_documents=20)
    tokenizer = train_wordpiece(lambda: iter_sentences(read_bert_format(path)), vocab_size=300)
    return path, tokenizer


def examples(path, tokenizer, stream=None, **kwargs) -> StreamingExamples:
    settings = {"max_seq_length": 64, "short_seq_prob": 0.1, "seed": 7, "batch_size": 4, "shuffle_buffer": 8}
    return StreamingExamples(stream or (lambda: read_bert_format(path)), tokenizer, **{**settings, **kwargs})


def test_each_reader_takes_its_own_documents(corpus_and_tokenizer):
    path, tokenizer = corpus_and_tokenizer
    shares = [
        [number for number, _ in examples(path, tokenizer, skip_documents=2, rank=r, world_size=3).documents(r, 3)]
        for r in range(3)
    ]
    assert sorted(n for share in shares for n in share) == list(range(2, 20))  # all but the 2 held out, once
    assert shares[1] == list(range(3, 20, 3))


def test_the_stream_repeats_and_a_resumed_reader_fast_forwards_exactly(corpus_and_tokenizer):
    path, tokenizer = corpus_and_tokenizer
    calls = []

    def once():  # the corpus, then nothing: a second pass finds no document for the reader
        calls.append(1)
        return read_bert_format(path) if len(calls) == 1 else iter(())

    one_pass = []
    with pytest.raises(UserError, match="no document for reader 0 of 1"):
        for pair in examples(path, tokenizer, stream=once).pairs(0, 1):
            one_pass.append(pair)
    fresh = list(islice(iter(examples(path, tokenizer)), 300))
    assert len(one_pass) < 150 and len(fresh) == 300  # the stream repeats, each pass drawn anew
    assert fresh[: len(one_pass)] != fresh[len(one_pass) : 2 * len(one_pass)]
    resumed = list(islice(iter(examples(path, tokenizer, start_batch=5)), 100))
    assert resumed == fresh[20:120]  # from batch 5 on (batch size 4), the masks' seeds included
    assert len({e["mask_seed"] for e in fresh}) == 300


@pytest.mark.parametrize("source", ["text", "hf-json"])
def test_streaming_pretraining_runs_with_workers_on_files_and_the_hub_loader(tmp_path, corpus_and_tokenizer, source):
    path, _ = corpus_and_tokenizer
    if source == "text":
        corpus = ["corpus=text", f"corpus.paths=[{path}]"]
    else:  # the hub loader with streaming=True, on local JSON lines in a hub dataset's shape
        rows = [{"text": " ".join(document)} for document in TextCorpus([str(path)]).documents()]
        jsonl = tmp_path / "docs.jsonl"
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        corpus = ["corpus=hf", "corpus.name=json", f"corpus.data_files=[{jsonl}]"]
    overrides = [
        "model=bert_tiny",
        "trainer=cpu",
        "logger=csv",
        "task.batch_size=4",
        "task.max_seq_length=64",
        "task.datamodule.vocab_size=300",
        "task.datamodule.streaming=true",
        "task.datamodule.validation_documents=2",
        "task.datamodule.shuffle_buffer=16",
        "task.datamodule.num_workers=2",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        *corpus,
    ]
    results = train(compose_config(overrides, tmp_path / "run"))
    assert results["global_step"] == 6 and results["metrics"]["val/loss"] > 0
