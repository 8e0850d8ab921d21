"""Corpora: BERT-format files, Hugging Face datasets (through local files), the demo corpus, and bad input."""

import json

import pytest

from lightbert.errors import UserError
from lightbert.tasks.pretraining.corpus import DemoCorpus, HFCorpus, TextCorpus, read_bert_format
from lightbert.tasks.pretraining.sentences import split_document, split_sentences


def test_bert_format_documents(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("First sentence.\nSecond one.\n\n\nOther doc.\n  \nThird doc line.\nAnd more.")
    assert list(read_bert_format(path)) == [
        ["First sentence.", "Second one."],
        ["Other doc."],
        ["Third doc line.", "And more."],
    ]


def test_text_corpus_loads_a_dataset(tmp_path, isolated_cache, corpus_file):
    documents = TextCorpus([str(corpus_file)]).load(isolated_cache)
    assert len(documents) == 40
    assert all(len(d) >= 4 for d in documents["sentences"])


def test_fingerprint_follows_the_file_content(corpus_file):
    before = TextCorpus([str(corpus_file)]).fingerprint
    corpus_file.write_text(corpus_file.read_text() + "\nOne more document here.\n")
    assert TextCorpus([str(corpus_file)]).fingerprint != before


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "does not exist"), (b"", "is empty"), (b"caf\xe9 au lait.\n", "is not UTF-8.*line 1.*iconv")],
)
def test_bad_corpus_files_are_clear_errors(tmp_path, isolated_cache, content, message):
    path = tmp_path / "bad.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=message) as error:
        TextCorpus([str(path)]).load(isolated_cache)
    assert "bad.txt" in str(error.value)


@pytest.mark.parametrize(
    ("encoding", "found", "source"),
    [
        ("utf-16", "UTF-16LE", "UTF-16"),  # a byte-order mark: iconv's UTF-16 reads it and drops it
        ("utf-16-be", "UTF-16BE", "UTF-16BE"),  # none: the NUL bytes of each ASCII character say the order
        ("utf-32", "UTF-32LE", "UTF-32"),
        ("utf-32-le", "UTF-32LE", "UTF-32LE"),
        ("latin1", None, "latin1"),
    ],
)
def test_text_in_another_encoding_gets_the_iconv_command_that_converts_it(tmp_path, encoding, found, source):
    """A UTF-16 corpus (Windows' "Unicode") once got advice to convert from Latin-1, or without a byte-order mark
    passed as UTF-8 text of NUL characters."""
    path = tmp_path / "corpus.txt"
    path.write_bytes("Caf\xe9 au lait.\nUne phrase.\n\nAutre document.\n".encode(encoding))
    with pytest.raises(UserError) as error:
        list(TextCorpus([str(path)]).documents())
    assert str(error.value).startswith(f"corpus file {path} is not UTF-8 text")
    assert (f"it is {found} text; " in str(error.value)) == (found is not None)
    assert f"convert it, e.g. `iconv -f {source} -t utf-8 corpus.txt > corpus.utf8.txt`" in str(error.value)


def test_hf_corpus_from_local_json_lines(tmp_path, isolated_cache):
    rows = [
        {"text": "Alpha is first. Beta is second!\nGamma starts a paragraph.", "id": 1},
        {"text": "Only one sentence here", "id": 2},
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    documents = HFCorpus(name="json", data_files=[str(path)]).load(isolated_cache)
    assert documents["sentences"] == [
        ["Alpha is first.", "Beta is second!", "Gamma starts a paragraph."],
        ["Only one sentence here"],
    ]
    with pytest.raises(UserError, match="no column 'body'.*'text'"):
        HFCorpus(name="json", data_files=[str(path)], text_column="body").load(isolated_cache)


def test_demo_corpus_is_real_english_prose(isolated_cache):
    corpus = DemoCorpus()
    path = corpus.build(isolated_cache)
    documents = list(read_bert_format(path))
    assert len(documents) > 300
    sentences = [s for d in documents for s in d]
    assert len(sentences) > 10_000
    assert sum(" the " in s for s in sentences) / len(sentences) > 0.3  # English, not code
    assert corpus.build(isolated_cache) == path  # built once


def test_sentence_splitter():
    assert split_sentences("It works. See e.g. the docs. Mr. J. Smith agreed! Did he? Yes.") == [
        "It works.",
        "See e.g. the docs.",
        "Mr. J. Smith agreed!",
        "Did he?",
        "Yes.",
    ]
    assert split_sentences('He said "stop." Then left.') == ['He said "stop."', "Then left."]
    assert split_sentences("Version 3.11 is out. 42 is the answer.") == ["Version 3.11 is out.", "42 is the answer."]
    assert split_document("One.\n\nTwo. Three.") == ["One.", "Two.", "Three."]


def test_a_hub_corpus_of_local_files_is_keyed_by_the_files_a_pattern_matches(tmp_path):
    (tmp_path / "a.txt").write_text("one document.\n")
    corpus = HFCorpus("text", data_files=str(tmp_path / "*.txt"))
    first = corpus.fingerprint
    (tmp_path / "b.txt").write_text("another document.\n")
    assert corpus.fingerprint != first  # the pattern matches one more file
