"""Sentence-pair examples for masked LM + next sentence prediction, as in the paper (§3.1, Appendix A.2).

A port of google-research/bert's `create_pretraining_data.py` (`create_instances_from_document` and
`truncate_seq_pair`), run on token ids inside `datasets.map`. Differences from the reference:
- Masking is not done here but in the collator (`lightbert.tasks.pretraining.masking`), fresh every epoch, so
  `dupe_factor` (the task file's default 10, the reference's) only re-draws the sentence pairing, not the masks.
- The random state is per document (seeded by seed, duplicate and document index), so the examples are
  the same whatever the number of preprocessing processes.
- Sentences that tokenize to nothing and documents without sentences are dropped before pairing.
- A chunk closes at the target length only once it holds two sentences (or at the document's end), so a
  sentence longer than the target still gets the 50% chance of its true next sentence as B.
- `truncate_seq_pair` draws how many tokens each segment loses at its front from a binomial, where the reference
  draws front or back for every token cut: the same distribution (its docstring says why), other draws.
- An example is made as a `Span` (create_spans_from_document): where its two segments lie in their documents,
  found from the sentences' lengths alone. The cache keeps the spans (`create_pretraining_pairs`) and the
  tokenized documents once, and `PairExamples` reads the token ids back; `create_instances_from_document` gives
  the same examples as token ids.

`task.datamodule.examples=chunks` makes the modern recipe's examples instead (ModernBERT, RoBERTa's FULL-SENTENCES
within a document, MosaicBERT, cramming): each document's tokens cut in order into consecutive chunks of at most
`max_seq_length - 2`, each read as `[CLS] chunk [SEP]` (one segment, no NSP label). Sentence boundaries are not
looked at, a document is chunked once (no `dupe_factor`, no `short_seq_prob`: the last chunk of a document is as short
as what is left, and packing fills rows with them), and a chunk never crosses into another document.
`create_chunks_from_document` gives them as token ids, `create_pretraining_chunks` as offsets (`Chunk`), which
`ChunkExamples` reads back.
"""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import NamedTuple

import datasets
import numpy as np

from lightbert.data.encoding import encode_pair
from lightbert.data.local_files import progress_bars_for

IS_NEXT, NOT_NEXT = 0, 1  # Hugging Face's convention for `next_sentence_label`


def truncation(length_a: int, length_b: int, max_num_tokens: int) -> tuple[int, int]:
    """How many tokens the reference's `truncate_seq_pair` cuts from a and from b: it cuts one token at a time from
    the longer side (b at a tie) until the pair fits, so the counts follow from the lengths alone. The longer side
    loses its lead first; the rest alternates b, a, b, ..."""
    excess = max(0, length_a + length_b - max_num_tokens)
    lead = min(excess, abs(length_a - length_b))
    rest = excess - lead
    cut_a, cut_b = rest // 2, rest - rest // 2
    if length_a > length_b:
        cut_a += lead
    else:
        cut_b += lead
    return cut_a, cut_b


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer side, one token at a time from its front or back at random, until the pair fits.

    The reference draws front or back (1/2 each) for every token it cuts. Which side each cut falls on depends on
    the lengths only (`truncation`), so the number of front cuts of a side that loses r tokens is the sum of r
    independent fair coins: Binomial(r, 1/2), independently for a and b, and the kept tokens are the window after
    those front cuts. Here that count is drawn at once as the number of ones among r random bits, so the same
    distribution of kept windows costs one draw per side, not one per token (22% of pair creation).
    """
    cut_a, cut_b = truncation(len(tokens_a), len(tokens_b), max_num_tokens)
    for tokens, cut in ((tokens_a, cut_a), (tokens_b, cut_b)):
        if cut:
            front = rng.getrandbits(cut).bit_count()
            tokens[:] = tokens[front : len(tokens) - (cut - front)]


class Span(NamedTuple):
    """One example as offsets: segment A is `a_length` tokens of document `a_document` from token `a_start` (counted
    over the document's sentences laid end to end), segment B likewise. Each segment is a run of consecutive
    sentences with some tokens cut at either end, so two offsets and two lengths say it all."""

    a_document: int
    a_start: int
    a_length: int
    b_document: int
    b_start: int
    b_length: int
    next_sentence_label: int


def create_spans_from_document(
    sentence_starts: Callable[[int], Sequence[int]],
    num_documents: int,
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
) -> list[Span]:
    """All `[CLS] A [SEP] B [SEP]` examples of one document as `Span`s; the tokens of a sentence are never read, only
    where each starts (`sentence_starts(i)`: the token offsets of document i's sentences, then where it ends; counted
    from the document's start or from any other origin)."""
    rows: list[int] = []
    starts = sentence_starts(document_index)
    starts = [start - starts[0] for start in starts] if starts[0] else starts
    append_spans(rows, sentence_starts, num_documents, document_index, starts, max_seq_length, short_seq_prob, rng)
    width = len(Span._fields)
    return [Span(*rows[i : i + width]) for i in range(0, len(rows), width)]


def append_spans(
    rows: list[int],
    sentence_starts: Callable[[int], Sequence[int]],
    num_documents: int,
    document_index: int,
    starts: Sequence[int],
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
) -> None:
    """`create_spans_from_document`'s spans, appended to `rows` as the `Span` fields of one after another (flat: 7
    ints an example, which numpy converts in bulk), given the document's own `starts` counted from 0.

    The reference's loop, with its draws in the same order, in half the time per example (2.9 against 5.8 us on the
    scale benchmark's corpus, `create_pretraining_pairs` included):
    `rng.randint(a, b)` is `a + rng._randbelow(b - a + 1)` (randint's argument checks cost more than the draw), the
    chunk's end is found by bisecting the sentence starts instead of stepping a sentence at a time, and the
    truncation is computed inline."""
    below, uniform, getrandbits = rng._randbelow, rng.random, rng.getrandbits
    num_sentences = len(starts) - 1
    last = num_sentences - 1
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Mostly fill the whole sequence, but sometimes (short_seq_prob) aim shorter, so fine-tuning on short
    # inputs is not a distribution shift. As in the reference, one target per document.
    target_seq_length = max_num_tokens
    if uniform() < short_seq_prob:
        target_seq_length = 2 + below(max_num_tokens - 1)  # randint(2, max_num_tokens)
    first = 0  # the chunk is the sentences first..i
    while first < num_sentences:
        # The chunk closes at the first sentence that brings it to the target length, but never on one lone
        # sentence mid-document: the reference would then be forced to a random B, which tilts NSP towards
        # NotNext on corpora of long sentences (55% on the demo corpus); taking the next sentence too keeps the
        # 50/50 draw. At the document's last sentence it closes anyway (also when `first` is that sentence: the
        # bisection then starts past the end).
        i = min(bisect_left(starts, starts[first] + target_seq_length, first + 2) - 1, last)
        chunk = i - first + 1
        a_end = 1 + below(chunk - 1) if chunk >= 2 else 1  # randint(1, chunk - 1)
        a_start = starts[first]
        a_length = starts[first + a_end] - a_start
        if chunk == 1 or uniform() < 0.5:
            label = NOT_NEXT
            target_b_length = target_seq_length - a_length
            # Up to 10 tries for another document; a one-document corpus falls back to itself.
            for _ in range(10):
                b_document = below(num_documents)
                if b_document != document_index:
                    break
            random_starts = sentence_starts(b_document)
            random_start = below(len(random_starts) - 1)
            # Sentences from random_start on until B holds target_b_length tokens (at least one sentence, at
            # most the rest of the document): the first sentence end at or past that many tokens.
            b_start = random_starts[random_start]
            end = bisect_left(random_starts, b_start + target_b_length, random_start + 1)
            b_length = random_starts[min(end, len(random_starts) - 1)] - b_start
            b_start -= random_starts[0]
            # The segments after A were not used: put them back for the next example.
            i -= chunk - a_end
        else:
            label = IS_NEXT
            b_document = document_index
            b_start = starts[first + a_end]
            b_length = starts[i + 1] - b_start
        # truncate_seq_pair's draws, on the offsets (`truncation`, inline).
        excess = a_length + b_length - max_num_tokens
        if excess > 0:
            lead = min(excess, abs(a_length - b_length))
            cut_a = (excess - lead) // 2
            cut_b = excess - lead - cut_a
            if a_length > b_length:
                cut_a += lead
            else:
                cut_b += lead
            front_a = getrandbits(cut_a).bit_count() if cut_a else 0
            front_b = getrandbits(cut_b).bit_count() if cut_b else 0
            rows += (document_index, a_start + front_a, a_length - cut_a, b_document, b_start + front_b,
                     b_length - cut_b, label)  # fmt: skip
        else:
            rows += (document_index, a_start, a_length, b_document, b_start, b_length, label)
        first = i + 1


def create_instances_from_document(
    documents: Sequence[list[list[int]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    cls_id: int,
    sep_id: int,
) -> list[dict]:
    """All `[CLS] A [SEP] B [SEP]` examples of one document (a list of tokenized sentences), as token ids."""
    flat: dict[int, list[int]] = {}

    def tokens(document: int, start: int, length: int) -> list[int]:
        if document not in flat:
            flat[document] = [t for sentence in documents[document] for t in sentence]
        return flat[document][start : start + length]

    starts = getattr(documents, "sentence_starts", None) or (lambda d: [0, *accumulate(len(s) for s in documents[d])])
    instances = []
    for span in create_spans_from_document(starts, len(documents), document_index, max_seq_length, short_seq_prob, rng):
        input_ids, token_type_ids = encode_pair(
            tokens(span.a_document, span.a_start, span.a_length),
            tokens(span.b_document, span.b_start, span.b_length),
            cls_id,
            sep_id,
        )
        instances.append(
            {"input_ids": input_ids, "token_type_ids": token_type_ids, "next_sentence_label": span.next_sentence_label}
        )
    return instances


class StoredDocuments:
    """Random access to the sentences of a column of documents (lists of lists of token ids) of an Arrow table,
    memory-mapped: a sentence is read from the column's offsets and values as it is asked for, never a whole
    document (a NotNext segment B uses a few sentences of a random document)."""

    def __init__(self, dataset: datasets.Dataset, column: str):
        self.dataset, self.column = dataset, column
        self.chunks = []  # per Arrow chunk: (document offsets, sentence offsets, token ids) as numpy views
        starts = [0]
        for chunk in dataset.data.column(column).chunks:
            sentences = chunk.values
            tokens = sentences.values.to_numpy(zero_copy_only=False)
            self.chunks.append((chunk.offsets.to_numpy(), sentences.offsets.to_numpy(), tokens))
            starts.append(starts[-1] + len(chunk))
        self.starts = np.asarray(starts)
        self.chunk_starts = starts  # a list: bisect on it costs a tenth of numpy's searchsorted on one value
        # A selected or shuffled view (a train/validation split) maps its rows to the table's.
        self.rows = None if dataset._indices is None else dataset._indices.column(0).to_numpy()
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def __reduce__(self):  # to a process that was not forked: the memory-mapped files, not copies of their views
        return StoredDocuments, (self.dataset, self.column)

    def locate(self, index: int) -> tuple[int, int]:
        """(chunk, row within it) of the dataset's row `index`."""
        row = int(index) if self.rows is None else self.rows[index].item()
        chunk = bisect_right(self.chunk_starts, row) - 1
        return chunk, row - self.chunk_starts[chunk]

    def __getitem__(self, index: int) -> _StoredDocument:
        chunk, row = self.locate(index)
        documents, sentences, tokens = self.chunks[chunk]
        return _StoredDocument(sentences, tokens, int(documents[row]), int(documents[row + 1]))

    def sentence_starts(self, index: int) -> list[int]:
        """The token offsets of document `index`'s sentences, then of its end, counted from its Arrow chunk's first
        token (`create_spans_from_document` takes them from any origin)."""
        chunk, row = self.locate(index)
        documents, sentences, _ = self.chunks[chunk]
        return sentences[documents[row] : documents[row + 1] + 1].tolist()

    def tokens(self, row: int, start: int, length: int) -> np.ndarray:
        """`length` tokens from token `start` of the document in table row `row` (its sentences end to end)."""
        chunk = bisect_right(self.chunk_starts, row) - 1
        documents, sentences, tokens = self.chunks[chunk]
        first = int(sentences[documents[row - self.chunk_starts[chunk]]]) + start
        return tokens[first : first + length]


class _StoredDocument(Sequence):
    """The sentences [first, past) of a stored document, each read as a list of ids when it is asked for."""

    def __init__(self, sentences: np.ndarray, tokens: np.ndarray, first: int, past: int):
        self.sentences, self.tokens, self.first, self.past = sentences, tokens, first, past

    def __len__(self) -> int:
        return self.past - self.first

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("a stored document is read in order")
            return _StoredDocument(self.sentences, self.tokens, self.first + start, self.first + max(start, stop))
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        s = self.first + index % len(self)
        return self.tokens[self.sentences[s] : self.sentences[s + 1]].tolist()

    def __iter__(self):
        for s in range(self.first, self.past):
            yield self.tokens[self.sentences[s] : self.sentences[s + 1]].tolist()


class _ColumnView(Sequence):
    """The documents of `stored`, except those of the batch being processed (`loaded`), already in memory."""

    def __init__(self, stored: StoredDocuments, loaded: dict[int, list]):
        self.stored, self.loaded = stored, loaded

    def __len__(self) -> int:
        return len(self.stored)

    def __getitem__(self, index: int):
        document = self.loaded.get(index)
        return document if document is not None else self.stored[index]

    def sentence_starts(self, index: int) -> list[int]:
        document = self.loaded.get(index)
        return [0, *accumulate(map(len, document))] if document is not None else self.stored.sentence_starts(index)


_stored: tuple[datasets.Dataset, StoredDocuments] | None = None


def _create_instances_batch(
    batch: dict,
    indices: list[int],
    documents: datasets.Dataset,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    cls_id: int,
    sep_id: int,
) -> dict:
    global _stored
    if _stored is None or _stored[0] is not documents:  # built once per process and split, not once per batch
        _stored = (documents, StoredDocuments(documents, "sentence_ids"))
    all_documents = _ColumnView(_stored[1], dict(zip(indices, batch["sentence_ids"], strict=True)))
    out: dict[str, list] = {"input_ids": [], "token_type_ids": [], "next_sentence_label": []}
    for document_index in indices:  # document-major, so batching and sharding never change the order
        for dupe in range(dupe_factor):
            rng = random.Random(f"{seed}/{dupe}/{document_index}")
            for instance in create_instances_from_document(
                all_documents, document_index, max_seq_length, short_seq_prob, rng, cls_id, sep_id
            ):
                for key, value in instance.items():
                    out[key].append(value)
    return out


EXAMPLE_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "token_type_ids": datasets.Sequence(datasets.Value("int8")),
        "next_sentence_label": datasets.Value("int8"),
    }
)


def create_pretraining_examples(
    documents: datasets.Dataset,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    cls_id: int,
    sep_id: int,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Examples from a dataset with a `sentence_ids` column (documents of tokenized sentences)."""
    with progress_bars_for(len(documents)):
        return documents.map(
            _create_instances_batch,
            batched=True,
            batch_size=256,
            with_indices=True,
            remove_columns=documents.column_names,
            features=EXAMPLE_FEATURES,
            num_proc=num_proc,
            load_from_cache_file=False,  # the caller caches the result; datasets' hash can't see code changes here
            fn_kwargs={
                "documents": documents,
                "max_seq_length": max_seq_length,
                "short_seq_prob": short_seq_prob,
                "dupe_factor": dupe_factor,
                "seed": seed,
                "cls_id": cls_id,
                "sep_id": sep_id,
            },
            desc="Creating sentence-pair examples",
        )


PAIR_FEATURES = datasets.Features(
    {
        "a_document": datasets.Value("uint32"),  # a row of the documents table
        "a_start": datasets.Value("uint32"),
        "a_length": datasets.Value("uint16"),
        "b_document": datasets.Value("uint32"),
        "b_start": datasets.Value("uint32"),
        "b_length": datasets.Value("uint16"),
        "next_sentence_label": datasets.Value("int8"),
    }
)


def _create_pairs_batch(
    batch: dict, documents: datasets.Dataset, max_seq_length: int, short_seq_prob: float, dupe_factor: int, seed: int
) -> dict:
    global _stored
    if _stored is None or _stored[0] is not documents:  # built once per process and split, not once per batch
        _stored = (documents, StoredDocuments(documents, "sentence_ids"))
    stored = _stored[1]
    sentence_starts, num_documents = stored.sentence_starts, len(stored)
    rows: list[int] = []
    for document_index in batch["document"]:  # document-major, so batching and sharding never change the order
        starts = sentence_starts(document_index)
        starts = [start - starts[0] for start in starts]  # read once for its dupe_factor pairings
        for dupe in range(dupe_factor):
            rng = random.Random(f"{seed}/{dupe}/{document_index}")
            append_spans(rows, sentence_starts, num_documents, document_index, starts, max_seq_length,
                         short_seq_prob, rng)  # fmt: skip
    # Columns as numpy arrays: Arrow takes them as they are, where lists of Python ints are converted one by one.
    table = np.array(rows, dtype=np.int64).reshape(-1, len(PAIR_FEATURES))
    out = {name: table[:, i] for i, name in enumerate(PAIR_FEATURES)}
    if stored.rows is not None:  # the split's document numbers to the table's rows, for the whole batch at once
        for name in ("a_document", "b_document"):
            out[name] = stored.rows[out[name]]
    return out


def create_pretraining_pairs(
    documents: datasets.Dataset,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    cache_file_name: str,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """The examples of `documents` (a view of a table with a `sentence_ids` column) as `Span`s, written to
    `cache_file_name` (one file per process): what `create_pretraining_examples` makes, in the same order, at about
    21 bytes an example instead of 5 bytes a token (`PairExamples` reads them back)."""
    numbers = datasets.Dataset.from_dict({"document": np.arange(len(documents), dtype=np.int64)})
    with progress_bars_for(len(documents)):
        return numbers.map(
            _create_pairs_batch,
            batched=True,
            batch_size=1024,  # also the rows of one Arrow record batch: few chunks for the loader to index
            remove_columns=["document"],
            features=PAIR_FEATURES,
            num_proc=num_proc,
            cache_file_name=cache_file_name,
            load_from_cache_file=False,
            fn_kwargs={
                "documents": documents,
                "max_seq_length": max_seq_length,
                "short_seq_prob": short_seq_prob,
                "dupe_factor": dupe_factor,
                "seed": seed,
            },
            desc="Creating sentence-pair examples",
        )


class Chunk(NamedTuple):
    """One `examples=chunks` example as offsets: `length` tokens of document `document` from token `start`."""

    document: int
    start: int
    length: int


def chunk_starts(num_tokens: int, max_seq_length: int) -> range:
    """Where each chunk of a document of `num_tokens` tokens starts: every `max_seq_length - 2` tokens (room for
    [CLS] and [SEP]), the last chunk holding what is left."""
    return range(0, num_tokens, max_seq_length - 2)


def create_chunks_from_document(tokens: Sequence[int], max_seq_length: int, cls_id: int, sep_id: int) -> list[dict]:
    """The `[CLS] chunk [SEP]` examples of one document's tokens (its sentences end to end), in order."""
    width = max_seq_length - 2
    return [
        {"input_ids": [cls_id, *tokens[start : start + width], sep_id],
         "token_type_ids": [0] * (min(width, len(tokens) - start) + 2)}
        for start in chunk_starts(len(tokens), max_seq_length)
    ]  # fmt: skip


CHUNK_FEATURES = datasets.Features(
    {
        "document": datasets.Value("uint32"),  # a row of the documents table
        "start": datasets.Value("uint32"),
        "length": datasets.Value("uint16"),
    }
)


def _create_chunks_batch(batch: dict, documents: datasets.Dataset, max_seq_length: int) -> dict:
    global _stored
    if _stored is None or _stored[0] is not documents:  # built once per process and split, not once per batch
        _stored = (documents, StoredDocuments(documents, "sentence_ids"))
    stored = _stored[1]
    rows: list[int] = []
    for document_index in batch["document"]:
        starts = stored.sentence_starts(document_index)
        num_tokens = starts[-1] - starts[0]
        for start in chunk_starts(num_tokens, max_seq_length):
            rows += (document_index, start, min(max_seq_length - 2, num_tokens - start))
    table = np.array(rows, dtype=np.int64).reshape(-1, len(CHUNK_FEATURES))
    out = {name: table[:, i] for i, name in enumerate(CHUNK_FEATURES)}
    if stored.rows is not None:  # the split's document numbers to the table's rows
        out["document"] = stored.rows[out["document"]]
    return out


def create_pretraining_chunks(
    documents: datasets.Dataset, max_seq_length: int, cache_file_name: str, num_proc: int | None = None
) -> datasets.Dataset:
    """The `examples=chunks` examples of `documents` (a view of a table with a `sentence_ids` column) as `Chunk`s,
    document after document, written to `cache_file_name` (`ChunkExamples` reads them back)."""
    numbers = datasets.Dataset.from_dict({"document": np.arange(len(documents), dtype=np.int64)})
    with progress_bars_for(len(documents)):
        return numbers.map(
            _create_chunks_batch,
            batched=True,
            batch_size=1024,
            remove_columns=["document"],
            features=CHUNK_FEATURES,
            num_proc=num_proc,
            cache_file_name=cache_file_name,
            load_from_cache_file=False,
            fn_kwargs={"documents": documents, "max_seq_length": max_seq_length},
            desc="Cutting documents into chunks",
        )


class StoredExamples:
    """Examples stored as offsets (one row of `FEATURES` each) over tokenized documents stored once; a subclass says
    how a row reads as token ids (`build`).

    Indexed as a `datasets.Dataset` is where the loaders and tests need it: a row number gives a row, a list of
    row numbers the columns of those rows, a column name that column; `select` keeps some rows."""

    FEATURES: datasets.Features
    COLUMNS: tuple[str, ...]

    def __init__(self, documents: StoredDocuments, stored: datasets.Dataset, cls_id: int, sep_id: int, rows=None):
        self.documents, self.stored, self.cls_id, self.sep_id = documents, stored, cls_id, sep_id
        # Numpy views of the memory-mapped columns, one per Arrow chunk: nothing of the size of the split in memory.
        self.columns = {name: [c.to_numpy() for c in stored.data.column(name).chunks] for name in self.FEATURES}
        first = next(iter(self.FEATURES))
        self.starts = np.cumsum([0] + [len(c) for c in self.columns[first]])
        self.rows = rows  # a selection of the stored rows, or None for all

    def __len__(self) -> int:
        return int(self.starts[-1]) if self.rows is None else len(self.rows)

    def __reduce__(self):  # as StoredDocuments
        return type(self), (self.documents, self.stored, self.cls_id, self.sep_id, self.rows)

    def select(self, indices) -> StoredExamples:
        rows = np.asarray(indices, dtype=np.int64) if self.rows is None else self.rows[np.asarray(indices)]
        return type(self)(self.documents, self.stored, self.cls_id, self.sep_id, rows)

    def example(self, index: int) -> dict:
        row = int(index) if self.rows is None else int(self.rows[index])
        if not 0 <= row < self.starts[-1]:
            raise IndexError(index)
        part = int(np.searchsorted(self.starts, row, side="right")) - 1  # the Arrow chunk
        at = row - int(self.starts[part])
        return self.build(*(int(self.columns[name][part][at]) for name in self.FEATURES))

    def build(self, *values: int) -> dict:
        raise NotImplementedError

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self.COLUMNS:
                raise KeyError(key)
            return [self.example(i)[key] for i in range(len(self))]
        if isinstance(key, int | np.integer):
            return self.example(key if key >= 0 else key + len(self))
        rows = [self.example(i) for i in key]
        return {name: [row[name] for row in rows] for name in self.COLUMNS}


class PairExamples(StoredExamples):
    """Examples stored as `Span`s, read as `[CLS] A [SEP] B [SEP]` rows with their NSP label."""

    FEATURES = PAIR_FEATURES
    COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label")

    def build(self, a_document, a_start, a_length, b_document, b_start, b_length, label) -> dict:
        a = self.documents.tokens(a_document, a_start, a_length).tolist()
        b = self.documents.tokens(b_document, b_start, b_length).tolist()
        return {
            "input_ids": [self.cls_id, *a, self.sep_id, *b, self.sep_id],
            "token_type_ids": [0] * (a_length + 2) + [1] * (b_length + 1),
            "next_sentence_label": label,
        }


class ChunkExamples(StoredExamples):
    """Examples stored as `Chunk`s, read as `[CLS] chunk [SEP]` rows: one segment, no NSP label."""

    FEATURES = CHUNK_FEATURES
    COLUMNS = ("input_ids", "token_type_ids")

    def build(self, document, start, length) -> dict:
        tokens = self.documents.tokens(document, start, length).tolist()
        return {"input_ids": [self.cls_id, *tokens, self.sep_id], "token_type_ids": [0] * (length + 2)}


EXAMPLE_KINDS = {"pairs": PairExamples, "chunks": ChunkExamples}  # task.datamodule.examples
