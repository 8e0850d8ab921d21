"""Streaming pre-training data: every reader its own documents, endless passes, exact fast-forward on resume."""

import json
import math
from itertools import islice

import pytest
from helpers.runs import compose_config, write_bert_corpus

from lightbert import train
from lightbert.data.tokenizer import iter_sentences, train_wordpiece
from lightbert.errors import UserError
from lightbert.tasks.pretraining.corpus import HFCorpus, TextCorpus, read_bert_format, read_shard
from lightbert.tasks.pretraining.streaming import StreamingExamples, held_out_examples, tokenized


@pytest.fixture(scope="module")
def corpus_and_tokenizer(tmp_path_factory):
    path = write_bert_corpus(tmp_path_factory.mktemp("stream") / "corpus.txt", num_documents=20)
    tokenizer = train_wordpiece(lambda: iter_sentences(read_bert_format(path)), vocab_size=300)
    return path, tokenizer


def examples(path, tokenizer, stream=None, **kwargs) -> StreamingExamples:
    settings = {"max_seq_length": 64, "short_seq_prob": 0.1, "seed": 7, "batch_size": 4, "shuffle_buffer": 8}
    stream = stream or (lambda shard=None: read_shard([path], shard))
    return StreamingExamples(stream, tokenizer, **{**settings, **kwargs})


def test_each_reader_takes_its_own_documents(corpus_and_tokenizer):
    path, tokenizer = corpus_and_tokenizer
    every = [tuple(map(tuple, tokenized(d, tokenizer))) for d in read_bert_format(path)]
    for readers in (1, 2, 3, 7):
        shares = [
            [tuple(map(tuple, d)) for _, d in examples(path, tokenizer, skip_documents=2).documents(r, readers)]
            for r in range(readers)
        ]
        assert sorted(d for share in shares for d in share) == sorted(every[2:])  # all but the 2 held out, once
        # Shares of the bytes: about 18 / readers documents each (7 readers: reader 0's 3 include the 2 held out).
        assert all(abs(len(share) - 18 / readers) <= 3 for share in shares)


def test_a_reader_reads_only_its_byte_range_or_its_files(tmp_path):
    text = "\n\n  \nA one.\nA two.\n\n\nB one.\n \nC one.\nC two.\nC three.\n\nD one.\n\nE one.\nE two."
    path = tmp_path / "one.txt"
    path.write_text(text)
    whole = list(read_bert_format(path))
    assert [d[0][0] for d in whole] == ["A", "B", "C", "D", "E"]
    size = path.stat().st_size
    for count in range(1, size + 2):  # ranges down to a byte, and more ranges than bytes
        ranges = [list(read_bert_format(path, size * i // count, size * (i + 1) // count)) for i in range(count)]
        assert [d for r in ranges for d in r] == whole  # every document once, in order
    # A range starting inside a document leaves it to the range it began in, and reads on to the end of its own.
    # A document belongs to the range that holds the line break before it (E's: the blank line at `before_e`).
    before_e = text.index("\n\nE one") + 1
    assert list(read_bert_format(path, text.index("C two"), before_e)) == [["D one."]]
    assert list(read_bert_format(path, text.index("C two"), before_e + 1)) == [["D one."], ["E one.", "E two."]]
    files = [tmp_path / f"f{i}.txt" for i in range(4)]
    for i, f in enumerate(files):
        f.write_text(f"Doc {i} first.\nDoc {i} second.\n\nDoc {i}b.\n")
    assert [d[0] for d in read_shard(files, (1, 2))] == ["Doc 1 first.", "Doc 1b.", "Doc 3 first.", "Doc 3b."]


def test_a_hub_stream_gives_each_reader_its_own_data_files(tmp_path):
    files = []
    for i in range(4):
        files.append(tmp_path / f"part{i}.jsonl")
        files[-1].write_text("".join(json.dumps({"text": f"Part {i} row {j}. It ends."}) + "\n" for j in range(3)))
    corpus = HFCorpus("json", data_files=[str(f) for f in files])
    shares = [[d[0] for d in corpus.stream(tmp_path / "cache", shard=(r, 2))] for r in range(2)]
    assert shares == [[f"Part {i} row {j}." for i in (0, 2) for j in range(3)],
                      [f"Part {i} row {j}." for i in (1, 3) for j in range(3)]]  # fmt: skip


def test_the_stream_repeats_and_a_resumed_reader_fast_forwards_exactly(corpus_and_tokenizer):
    path, tokenizer = corpus_and_tokenizer
    calls = []

    def once(shard=None):  # the corpus, then nothing: a second pass finds no document for the reader
        calls.append(1)
        return read_shard([path], shard) if len(calls) == 1 else iter(())

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


def test_streamed_chunks_are_each_documents_tokens_in_order(corpus_and_tokenizer):
    """examples=chunks on the stream: one pass's chunks (before the shuffle buffer), and the held-out ones, are each
    document's tokens cut in order into [CLS] chunk [SEP] of at most max_seq_length tokens, nothing lost or repeated."""
    path, tokenizer = corpus_and_tokenizer
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    documents = [[t for s in tokenized(d, tokenizer) for t in s] for d in read_bert_format(path)]
    passes = examples(path, tokenizer, skip_documents=3, max_seq_length=24, examples="chunks").pairs(0, 1)
    one_pass = list(islice(passes, sum(math.ceil(len(d) / 22) for d in documents[3:])))
    assert all(c["input_ids"][0] == cls_id and c["input_ids"][-1] == sep_id for c in one_pass)
    assert max(len(c["input_ids"]) for c in one_pass) == 24 and "next_sentence_label" not in one_pass[0]
    assert [t for c in one_pass for t in c["input_ids"][1:-1]] == [t for d in documents[3:] for t in d]
    assert next(passes)["input_ids"][1:-1] == documents[3][:22]  # the next pass starts again
    held_out = held_out_examples(read_bert_format(path), tokenizer, 24, 0.1, 7, examples="chunks")
    assert [t for c in held_out for t in c["input_ids"][1:-1]] == [t for d in documents for t in d]


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
