"""Sentence-pair examples: layout, lengths, true continuations for IsNext, NSP balance."""

import random
from bisect import bisect_left
from itertools import accumulate

import datasets
import pytest

from lightbert.tasks.pretraining.examples import (
    IS_NEXT,
    NOT_NEXT,
    Span,
    StoredDocuments,
    create_instances_from_document,
    create_pretraining_examples,
    create_pretraining_pairs,
    create_spans_from_document,
    truncation,
)

CLS, SEP = 2, 3


def synthetic_documents(num_documents: int, seed: int = 0, sentences=(2, 15)) -> list[list[list[int]]]:
    """Token ids encode (document, sentence, position), so any example can be traced back to its source."""
    rng = random.Random(seed)
    return [
        [[10_000 * (d + 1) + 100 * s + t for t in range(rng.randint(3, 40))] for s in range(rng.randint(*sentences))]
        for d in range(num_documents)
    ]


def source(token: int) -> tuple[int, int]:
    return token // 10_000 - 1, (token % 10_000) // 100


def all_examples(documents, max_seq_length=64, short_seq_prob=0.1, seed=0):
    examples = []
    for index in range(len(documents)):
        rng = random.Random(f"{seed}/{index}")
        examples += create_instances_from_document(documents, index, max_seq_length, short_seq_prob, rng, CLS, SEP)
    return examples


@pytest.mark.parametrize("max_seq_length", [16, 64, 128])
def test_layout_lengths_and_segment_ids(max_seq_length):
    for example in all_examples(synthetic_documents(200), max_seq_length=max_seq_length):
        ids, types = example["input_ids"], example["token_type_ids"]
        assert len(ids) == len(types) <= max_seq_length
        assert ids[0] == CLS and ids[-1] == SEP and ids.count(SEP) == 2 and ids.count(CLS) == 1
        first_sep = ids.index(SEP)
        assert first_sep >= 2 and len(ids) - first_sep >= 3, "A and B each have at least one token"
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)


def test_is_next_b_continues_a_and_not_next_b_comes_from_elsewhere():
    documents = synthetic_documents(200, seed=1)
    examples = all_examples(documents, max_seq_length=128, short_seq_prob=0.0)
    for example in examples:
        ids = example["input_ids"]
        first_sep = ids.index(SEP)
        a, b = ids[1:first_sep], ids[first_sep + 1 : -1]
        doc_a, doc_b = source(a[0])[0], source(b[0])[0]
        assert a == sorted(a) and b == sorted(b), "segments are contiguous text, in order"
        if example["next_sentence_label"] == IS_NEXT:
            # Truncation may trim A's end or B's start, but B still follows A in the same document.
            assert doc_a == doc_b and a[-1] < b[0]
        else:
            assert example["next_sentence_label"] == NOT_NEXT
            assert doc_b != doc_a  # with 200 documents, 10 tries always find another one


def test_nsp_balance_near_half():
    # Documents of 10-60 sentences, like encyclopedia articles. A lone last sentence of a document can only
    # pair with a random B (as in the reference), which tilts short documents a little towards NotNext.
    examples = all_examples(synthetic_documents(1000, seed=2, sentences=(10, 60)), max_seq_length=128)
    not_next = sum(e["next_sentence_label"] == NOT_NEXT for e in examples) / len(examples)
    assert 0.47 < not_next < 0.54, not_next
    assert len(examples) > 5000


def test_short_seq_prob_gives_shorter_targets():
    documents = synthetic_documents(400, seed=3)
    long_only = all_examples(documents, max_seq_length=128, short_seq_prob=0.0)
    mixed = all_examples(documents, max_seq_length=128, short_seq_prob=0.5)
    mean = lambda xs: sum(len(x["input_ids"]) for x in xs) / len(xs)  # noqa: E731
    assert mean(mixed) < mean(long_only) - 10


def test_datasets_map_gives_the_same_examples_whatever_the_process_count():
    documents = datasets.Dataset.from_dict({"sentence_ids": synthetic_documents(150, seed=4)})
    kwargs = dict(max_seq_length=64, short_seq_prob=0.1, dupe_factor=2, seed=7, cls_id=CLS, sep_id=SEP)
    one = create_pretraining_examples(documents, **kwargs)
    two = create_pretraining_examples(documents, num_proc=2, **kwargs)
    assert one["input_ids"] == two["input_ids"]
    assert one["next_sentence_label"] == two["next_sentence_label"]
    assert len(one) > 2 * 150  # dupe_factor 2: every document paired twice


def test_stored_documents_read_the_sentences_of_any_split_of_a_table_of_several_chunks():
    parts = [datasets.Dataset.from_dict({"sentence_ids": synthetic_documents(60, seed=s)}) for s in (1, 2)]
    sliced = datasets.concatenate_datasets(parts).select(range(5, 120))  # a contiguous select slices the table
    split = sliced.train_test_split(test_size=15, seed=3)["train"]  # shuffled: an indices mapping over the table
    stored = StoredDocuments(split, "sentence_ids")
    assert len(stored.chunks) >= 2 and len(stored) == len(split) == 100
    for index in range(len(split)):
        expected = split[index]["sentence_ids"]
        document = stored[index]
        assert len(document) == len(expected) and list(document) == expected
        assert list(document[1:]) == expected[1:] and document[-1] == expected[-1]


def reference_spans(starts_of, num_documents, document_index, max_seq_length, short_seq_prob, rng):
    """`create_spans_from_document` as it was written before it was made fast (a sentence at a time, `randint`,
    `truncation`): the spans every seed gave then, which the fast loop keeps."""
    starts = starts_of(document_index)
    num_sentences = len(starts) - 1
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    spans, first, i = [], 0, 0
    while i < num_sentences:
        chunk = i - first + 1
        if i == num_sentences - 1 or (starts[i + 1] - starts[first] >= target_seq_length and chunk >= 2):
            a_end = rng.randint(1, chunk - 1) if chunk >= 2 else 1
            a_start, a_length = starts[first], starts[first + a_end] - starts[first]
            if chunk == 1 or rng.random() < 0.5:
                label = NOT_NEXT
                target_b_length = target_seq_length - a_length
                for _ in range(10):
                    random_index = rng.randint(0, num_documents - 1)
                    if random_index != document_index:
                        break
                random_starts = starts_of(random_index)
                random_start = rng.randint(0, len(random_starts) - 2)
                b_document, b_start = random_index, random_starts[random_start]
                end = bisect_left(random_starts, b_start + target_b_length, random_start + 1)
                b_length = random_starts[min(end, len(random_starts) - 1)] - b_start
                i -= chunk - a_end
            else:
                label = IS_NEXT
                b_document, b_start = document_index, starts[first + a_end]
                b_length = starts[i + 1] - b_start
            cut_a, cut_b = truncation(a_length, b_length, max_num_tokens)
            front_a = rng.getrandbits(cut_a).bit_count() if cut_a else 0
            front_b = rng.getrandbits(cut_b).bit_count() if cut_b else 0
            spans.append(Span(document_index, a_start + front_a, a_length - cut_a, b_document, b_start + front_b,
                              b_length - cut_b, label))  # fmt: skip
            first = i + 1
        i += 1
    return spans


@pytest.mark.parametrize(
    ("num_documents", "sentences", "max_seq_length", "short_seq_prob"),
    [(300, (1, 15), 64, 0.1), (300, (1, 4), 16, 0.5), (200, (10, 60), 128, 0.1), (1, (1, 30), 32, 0.2),
     (2, (1, 2), 8, 0.0), (50, (1, 300), 512, 1.0)],
)  # fmt: skip
def test_the_fast_pairing_gives_the_reference_spans(num_documents, sentences, max_seq_length, short_seq_prob):
    documents = synthetic_documents(num_documents, seed=num_documents, sentences=sentences)

    def starts_of(index):
        return [0, *accumulate(map(len, documents[index]))]

    def shifted(index):  # offsets from another origin, as StoredDocuments gives them
        return [1000 + start for start in starts_of(index)]

    for index in range(num_documents):
        for dupe in range(3):
            seed = f"7/{dupe}/{index}"
            expected = reference_spans(starts_of, num_documents, index, max_seq_length, short_seq_prob,
                                       random.Random(seed))  # fmt: skip
            for starts in (starts_of, shifted):
                spans = create_spans_from_document(starts, num_documents, index, max_seq_length, short_seq_prob,
                                                   random.Random(seed))  # fmt: skip
                assert spans == expected


def test_the_stored_pairs_are_the_reference_spans_of_a_split_of_several_chunks(tmp_path):
    parts = [datasets.Dataset.from_dict({"sentence_ids": synthetic_documents(60, seed=s, sentences=(1, 30))})
             for s in (1, 2)]  # fmt: skip
    table = datasets.concatenate_datasets(parts)
    split = table.select(range(5, 120)).train_test_split(test_size=15, seed=3)["train"]
    pairs = create_pretraining_pairs(split, max_seq_length=48, short_seq_prob=0.2, dupe_factor=2, seed=9,
                                     cache_file_name=str(tmp_path / "pairs.arrow"))  # fmt: skip
    rows = split._indices.column(0).to_pylist()  # the split's documents as rows of the table

    def starts_of(index):
        return [0, *accumulate(map(len, split[index]["sentence_ids"]))]

    expected = []
    for index in range(len(split)):
        for dupe in range(2):
            for span in reference_spans(starts_of, len(split), index, 48, 0.2, random.Random(f"9/{dupe}/{index}")):
                expected.append(span._replace(a_document=rows[span.a_document], b_document=rows[span.b_document]))
    assert [Span(*(pairs[name][i] for name in Span._fields)) for i in range(len(pairs))] == expected
