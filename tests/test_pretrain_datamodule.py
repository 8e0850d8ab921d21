"""The pre-training DataModule: prepared once and cached, held-out documents, masked batches."""

import math
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.runs import write_bert_corpus

from lightbert.data.tokenizer import train_wordpiece
from lightbert.errors import UserError
from lightbert.tasks.pretraining.corpus import TextCorpus, read_bert_format
from lightbert.tasks.pretraining.datamodule import PretrainDataModule
from lightbert.tasks.pretraining.masking import IGNORE_INDEX


def datamodule(path, cache, **kwargs) -> PretrainDataModule:
    options = dict(vocab_size=300, max_seq_length=64, batch_size=4, num_workers=0) | kwargs
    return PretrainDataModule(TextCorpus([str(path)]), cache_dir=str(cache), **options)


def test_prepared_once_then_loaded_from_cache(tmp_path, corpus_file):
    first = datamodule(corpus_file, tmp_path)
    first.prepare_data()
    stamp = (first.examples_dir / "examples.json").stat().st_mtime_ns
    second = datamodule(corpus_file, tmp_path)
    assert second.examples_dir == first.examples_dir
    second.prepare_data()  # a cache hit: nothing rewritten
    assert (second.examples_dir / "examples.json").stat().st_mtime_ns == stamp
    # Different settings or different text: a different cache entry.
    assert datamodule(corpus_file, tmp_path, max_seq_length=32).examples_dir != first.examples_dir
    write_bert_corpus(corpus_file, seed=9)
    assert datamodule(corpus_file, tmp_path).examples_dir != first.examples_dir


def test_validation_documents_are_held_out_whole(tmp_path, corpus_file):
    dm = datamodule(corpus_file, tmp_path, validation_fraction=0.25)
    dm.prepare_data()
    dm.setup("fit")
    train, validation = dm.datasets["train"], dm.datasets["validation"]
    assert len(train) > 2 * len(validation) > 0  # 30 documents against 10

    def segment_a_sentences(dataset):  # a first segment starts at a sentence of its own document
        return {tuple(ids[1 : ids.index(dm.tokenizer.sep_id)][:5]) for ids in dataset["input_ids"]}

    assert not segment_a_sentences(train) & segment_a_sentences(validation)


def test_batches_are_masked_and_validation_masks_repeat(tmp_path, corpus_file):
    dm = datamodule(corpus_file, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "labels",
        "next_sentence_label",
        "masked_positions",
    }
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] % 8 == 0
    assert (batch["labels"] != IGNORE_INDEX).sum() > 0
    first, again = next(iter(dm.val_dataloader())), next(iter(dm.val_dataloader()))
    assert torch.equal(first["labels"], again["labels"])  # comparable validation metrics across evaluations


def test_a_vocabulary_is_trained_once_in_a_child_on_the_first_documents(tmp_path, corpus_file, caplog):
    documents = list(read_bert_format(corpus_file))
    caplog.set_level("INFO", logger="lightbert")
    # Under the sample size: the vocabulary of every sentence of the corpus.
    whole = datamodule(corpus_file, tmp_path / "a").tokenizer.backend.get_vocab()
    assert whole == train_wordpiece([s for d in documents for s in d], vocab_size=300).backend.get_vocab()
    # A bounded sample: the first documents only, said on the console, and nothing of it left on disk.
    sample = datamodule(corpus_file, tmp_path / "b", tokenizer_documents=3)
    assert (
        sample.tokenizer.backend.get_vocab()
        == (train_wordpiece([s for d in documents[:3] for s in d], vocab_size=300).backend.get_vocab())
        != whole
    )
    assert "trained on the first 3 documents" in caplog.text and "tokenizer_documents=3" in caplog.text
    assert [p.name for p in sample.cache_dir.glob("tokenizers/*/*")] == ["tokenizer.json.gz"]


def test_the_cached_tokenizer_is_gzipped_and_an_older_plain_entry_is_still_read(tmp_path, corpus_file, monkeypatch):
    """The cache's copy is gzipped compact JSON (a fifth of the bytes: 0.12x the text at 4 MB as plain JSON); a plain
    tokenizer.json an older version wrote under the same key is read as it is, not trained again."""
    import gzip

    trained = datamodule(corpus_file, tmp_path / "cache").tokenizer
    (cached,) = (tmp_path / "cache" / "tokenizers").glob("*/*")
    assert cached.name == "tokenizer.json.gz"
    text = gzip.decompress(cached.read_bytes()).decode()
    assert text == trained.backend.to_str() and cached.stat().st_size < len(text) / 2
    cached.with_name("tokenizer.json").write_text(text)  # as an older version left the entry
    cached.unlink()
    monkeypatch.setattr(PretrainDataModule, "_train_tokenizer", None)  # nothing is trained: a call would fail
    again = datamodule(corpus_file, tmp_path / "cache").tokenizer
    assert again.backend.get_vocab() == trained.backend.get_vocab()
    assert [p.name for p in cached.parent.iterdir()] == ["tokenizer.json"]


def test_an_error_in_the_tokenizer_process_is_raised_in_the_run(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("Caf\xe9 au lait.\nUne phrase.\n".encode("latin1"))
    dm = datamodule(tmp_path / "latin1.txt", tmp_path / "cache", streaming=True)
    with pytest.raises(UserError, match="is not UTF-8 text"):
        dm.tokenizer  # noqa: B018 (a property that trains)


def test_the_held_out_split_and_each_validation_are_bounded(tmp_path, corpus_file):
    def validation(**kwargs):
        dm = datamodule(corpus_file, tmp_path, validation_fraction=0.5, **kwargs)
        dm.prepare_data()
        dm.setup("fit")
        return dm

    many, few = validation(), validation(validation_documents=2)
    assert 0 < len(few.datasets["validation"]) < len(many.datasets["validation"]) / 4  # 2 documents, not 20
    # A validation reads validation_share x the batches between two validations x batch_size examples, spread
    # over the split, whatever the number of devices; without a trainer (or with a null share) the whole split.
    held_out = many.datasets["validation"]
    assert len(many.validation_examples()) == len(held_out)
    for world_size in (1, 2):
        many.trainer = SimpleNamespace(val_check_interval=40, world_size=world_size)
        chosen = many.validation_examples()
        assert len(chosen) == 2 * 4  # ceil(0.05 x 40) batches of 4
        assert chosen["input_ids"][-1] == held_out[7 * len(held_out) // 8]["input_ids"]
        assert len(list(many.val_dataloader())) == 2
    many.validation_share = None
    assert len(many.validation_examples()) == len(held_out)


def test_examples_are_offsets_into_documents_stored_once_in_16_bits(tmp_path, corpus_file):
    import datasets

    from lightbert.tasks.pretraining.examples import create_pretraining_examples

    sizes = {}
    for dupe_factor in (1, 3):
        dm = datamodule(corpus_file, tmp_path, dupe_factor=dupe_factor, seed=5)
        dm.prepare_data()
        dm.setup("fit")
        files = {p.name: p.stat().st_size for p in dm.examples_dir.iterdir()}
        sizes[dupe_factor] = files
        assert sorted(files) == ["documents.arrow", "examples.json", "train.arrow", "validation.arrow"]
        assert files["train.arrow"] < 24 * len(dm.datasets["train"]) + 2000  # ~21 bytes an example, not 5 a token
        documents = datasets.Dataset.from_file(str(dm.examples_dir / "documents.arrow"))
        assert documents.features["sentence_ids"].feature.feature.dtype == "uint16"  # a vocabulary of 300
        tokenized = [[ids for ids in dm.tokenizer.encode_batch(d) if ids] for d in read_bert_format(corpus_file)]
        assert documents["sentence_ids"] == [d for d in tokenized if d]  # every document once, as the tokenizer says
        # The examples of the in-memory path (create_pretraining_examples), row for row, from the same split.
        split = documents.train_test_split(test_size=2, seed=5)  # 5% of 40 documents
        for name, part in (("train", split["train"]), ("validation", split["test"])):
            expected = create_pretraining_examples(part, max_seq_length=64, short_seq_prob=0.1, seed=5,
                                                   dupe_factor=dupe_factor, cls_id=dm.tokenizer.cls_id,
                                                   sep_id=dm.tokenizer.sep_id)  # fmt: skip
            stored = dm.datasets[name]
            assert len(stored) == len(expected)
            for column in ("input_ids", "token_type_ids", "next_sentence_label"):
                assert stored[column] == expected[column]
    assert sizes[1]["documents.arrow"] == sizes[3]["documents.arrow"]  # not stored dupe_factor times


def test_sentences_that_tokenize_to_nothing_and_documents_left_empty_are_dropped():
    from lightbert.tasks.pretraining.cache import _tokenize_documents

    tokenizer = train_wordpiece(["the dog runs home", "a cat sleeps"] * 20, vocab_size=60)
    batch = {"sentences": [["the dog", "\x00", "a cat"], ["\x01", " "], [], ["runs home"]]}
    column = _tokenize_documents(batch, tokenizer, "uint16").column("sentence_ids").to_pylist()
    assert column == [tokenizer.encode_batch(["the dog", "a cat"]), tokenizer.encode_batch(["runs home"])]


def test_a_vocabulary_past_65536_tokens_is_stored_in_32_bits(tmp_path, corpus_file):
    import datasets

    from lightbert.data.tokenizer import SPECIAL_TOKENS, load_tokenizer

    words = sorted({w.strip(".,;:!?").lower() for w in corpus_file.read_text().split()} - {""})
    filler = [f"filler{i}" for i in range(70_000)]  # the corpus's words come after them: ids past 65,535
    (tmp_path / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, *filler, *words, ".", ","]) + "\n")
    tokenizer = load_tokenizer(tmp_path / "vocab.txt")
    dm = datamodule(corpus_file, tmp_path / "cache", tokenizer=tokenizer)
    dm.prepare_data()
    dm.setup("fit")
    documents = datasets.Dataset.from_file(str(dm.examples_dir / "documents.arrow"))
    assert documents.features["sentence_ids"].feature.feature.dtype == "uint32"
    first = next(iter(read_bert_format(corpus_file)))
    assert documents[0]["sentence_ids"] == tokenizer.encode_batch(first)
    assert max(max(ids) for ids in dm.datasets["train"]["input_ids"]) > 70_000


def test_the_cache_holds_the_examples_and_no_copy_of_the_text(tmp_path):
    """Once a `datasets` Arrow copy of the raw text beside the examples, which no run read again: 1.8x the text here
    (2.1x at 32 MB, bench/scale_data.py). The examples are tokenized from the files as they are read."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=200)  # 87 KB
    dm = datamodule(corpus, tmp_path / "cache", max_seq_length=128, dupe_factor=1)
    dm.prepare_data()
    parts = {
        part.name: sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) for part in dm.cache_dir.iterdir()
    }
    assert set(parts) == {"examples", "tokenizers"}, parts
    assert sum(parts.values()) / corpus.stat().st_size <= 1.1, parts
    dm.setup("fit")
    assert len(dm.datasets["train"]) > 100


def test_a_corpus_tokenized_by_several_processes_gives_one_processs_documents(tmp_path, monkeypatch):
    """Each process tokenizes a contiguous share of the files' bytes: the documents, and so the examples, come in the
    files' order whatever the number of processes (a run on another machine builds the same examples)."""
    import datasets

    from lightbert.tasks.pretraining import cache as module

    first = write_bert_corpus(tmp_path / "a.txt", num_documents=30, seed=1)
    second = write_bert_corpus(tmp_path / "b.txt", num_documents=30, seed=2)
    monkeypatch.setattr(module, "BYTES_PER_DOCUMENT", 1)  # as many processes as preprocessing_workers allows

    def built(workers: int, cache: str) -> PretrainDataModule:
        corpus = TextCorpus([str(first), str(second)])
        dm = PretrainDataModule(corpus, cache_dir=str(tmp_path / cache), vocab_size=300, max_seq_length=64,
                                batch_size=4, num_workers=0, preprocessing_workers=workers)  # fmt: skip
        dm.prepare_data()
        dm.setup("fit")
        return dm

    one, three = built(1, "one"), built(3, "three")
    shares = sorted(p.name for p in three.examples_dir.glob("documents*.arrow"))
    assert shares == [f"documents-0000{i}-of-00003.arrow" for i in range(3)]
    stored = datasets.concatenate_datasets([datasets.Dataset.from_file(str(three.examples_dir / n)) for n in shares])
    documents = [*read_bert_format(first), *read_bert_format(second)]
    assert stored["sentence_ids"] == [[ids for ids in one.tokenizer.encode_batch(d) if ids] for d in documents]
    for split in ("train", "validation"):
        assert three.datasets[split]["input_ids"] == one.datasets[split]["input_ids"]


def test_a_tokenizing_process_that_is_killed_ends_the_preparation_in_one_line(tmp_path, monkeypatch):
    """A process killed (for memory, most likely) while it tokenizes its share: one line, not a wait for ever."""
    import os
    import signal

    from lightbert.tasks.pretraining import cache as module

    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=60)
    monkeypatch.setattr(module, "BYTES_PER_DOCUMENT", 1)
    parent, tokenize = os.getpid(), module._tokenize_documents

    def killed_in_a_child(*args):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return tokenize(*args)

    monkeypatch.setattr(module, "_tokenize_documents", killed_in_a_child)
    dm = datamodule(corpus, tmp_path / "cache", tokenizer=train_wordpiece(["the dog runs"] * 20, vocab_size=60),
                    preprocessing_workers=2)  # fmt: skip
    with pytest.raises(UserError, match="one of its 2 processes ended without a word; if it ran out of memory"):
        dm.prepare_data()
    assert not any((tmp_path / "cache" / "examples").iterdir())  # nothing half-written left


# -- task.datamodule.examples=chunks: each document's tokens cut in order (the modern recipe's examples) ------------


def chunked(path, cache, **kwargs) -> PretrainDataModule:
    dm = datamodule(path, cache, examples="chunks", objective="mlm", **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_chunks_are_each_documents_tokens_in_order_once(tmp_path, corpus_file, caplog):
    """Through the real DataModule: every chunk is [CLS] tokens [SEP]; the chunks of a document, in the order they
    are stored, are its tokens (its sentences end to end) with nothing lost, duplicated, reordered or taken from
    another document; every chunk but a document's last is full. Said once on the console."""
    caplog.set_level("INFO", logger="lightbert")
    dm = chunked(corpus_file, tmp_path, max_seq_length=24, validation_fraction=0.25)
    tokenizer = dm.tokenizer
    width = 24 - 2
    joined, counts = [], []
    for name in ("train", "validation"):
        split = dm.datasets[name]
        owners = np.concatenate([c.to_numpy() for c in split.stored.data.column("document").chunks])
        assert len(owners) == len(split) > 0
        tokens: dict[int, list[int]] = {}
        previous = None
        for owner, example in zip(owners.tolist(), (split[i] for i in range(len(split))), strict=True):
            ids = example["input_ids"]
            assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id and len(ids) <= 24
            assert example["token_type_ids"] == [0] * len(ids) and set(example) == {"input_ids", "token_type_ids"}
            assert tokenizer.sep_id not in ids[1:-1] and tokenizer.cls_id not in ids[1:-1]
            if owner in tokens:  # a document's chunks are consecutive, and all but its last one full
                assert owner == previous and len(tokens[owner]) % width == 0
            tokens.setdefault(owner, []).extend(ids[1:-1])
            previous = owner
        joined += tokens.values()
        counts += [math.ceil(len(t) / width) for t in tokens.values()]
    expected = [[t for s in tokenizer.encode_batch(d) for t in s] for d in read_bert_format(corpus_file)]
    assert sorted(joined) == sorted(expected)  # every document once, each exactly its tokens in order
    assert sum(counts) == len(dm.datasets["train"]) + len(dm.datasets["validation"])
    assert max(counts) >= 5 and min(map(len, expected)) > width  # the corpus's documents are cut, into many chunks
    said = [r.message for r in caplog.records if r.message.startswith("examples: ")]
    assert said == [f"examples: {len(dm.datasets['train'])} training and {len(dm.datasets['validation'])} held-out "
                    "chunks of at most 24 tokens, 40 documents' tokens cut in order (task.datamodule.examples=chunks: "
                    "[CLS] chunk [SEP], no sentence pairs; dupe_factor and short_seq_prob do not apply)"]  # fmt: skip
    # Masked and packed as any examples: MLM labels only, every row within the width.
    batch = next(iter(chunked(corpus_file, tmp_path, max_seq_length=24, packing=True).train_dataloader()))
    assert "next_sentence_label" not in batch and batch["input_ids"].shape[1] == 24
    assert (batch["labels"] != IGNORE_INDEX).sum() > 0


def test_chunks_and_pairs_are_cached_apart_and_never_read_as_each_other(tmp_path, corpus_file, caplog):
    pairs = datamodule(corpus_file, tmp_path)
    pairs.prepare_data()
    chunks = chunked(corpus_file, tmp_path)
    assert chunks.examples_dir != pairs.examples_dir
    pairs.setup("fit")
    assert (
        "next_sentence_label" in pairs.datasets["train"][0] and "next_sentence_label" not in chunks.datasets["train"][0]
    )
    # Chunks are keyed by what they read: short_seq_prob and dupe_factor are the pairs' alone.
    assert datamodule(corpus_file, tmp_path, examples="chunks", objective="mlm", dupe_factor=3,
                      short_seq_prob=0.5).examples_dir == chunks.examples_dir  # fmt: skip
    # A pairs entry found under the chunks' key (copied there by hand, an older version's): rebuilt, not read.
    shutil.rmtree(chunks.examples_dir)
    shutil.copytree(pairs.examples_dir, chunks.examples_dir)
    caplog.set_level("WARNING", logger="lightbert")
    again = chunked(corpus_file, tmp_path)
    assert "the entry holds pairs, not chunks" in caplog.text and "it is rebuilt" in caplog.text
    assert len(again.datasets["train"]) == len(chunks.datasets["train"])
    assert again.datasets["train"][0] == chunks.datasets["train"][0]


def test_next_sentence_prediction_on_chunks_is_refused_in_one_line(tmp_path, corpus_file):
    from lightbert.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        datamodule(corpus_file, tmp_path, examples="chunks")  # the default objective: mlm_nsp
    assert str(error.value) == (
        "examples=chunks has no sentence pairs, and task.objective=mlm_nsp asks for next sentence prediction: set "
        "task.objective=mlm (masked LM alone), or examples=pairs for BERT's sentence pairs"
    )
    with pytest.raises(ConfigError, match="examples='sentences' is not known; valid: \\['pairs', 'chunks'\\]"):
        datamodule(corpus_file, tmp_path, examples="sentences", objective="mlm")
