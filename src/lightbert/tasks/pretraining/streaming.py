"""Pre-training examples made on the fly from a document stream: for corpora larger than the disk cache.

`task.datamodule.streaming=true` reads the corpus as a stream (local files line by line, a hub dataset with
`streaming=True`) instead of tokenizing it into a cache first. Each reader (a device, or a DataLoader worker of a
device) reads only its share of the corpus, R being the number of readers in the whole run: local files, whole
files if there are at least R of them, else the R-th part of the bytes of every file (a document belongs to the
part it starts in); a hub dataset, its own data files where it has a multiple of R of them
(`datasets.distributed.split_dataset_by_node`), else every R-th row of the stream. The reader tokenizes the
document and makes its sentence pairs, as `create_instances_from_document` does for the cached path. Then the
pairs go through a shuffle buffer. How this differs from the cached path:
- A NotNext segment B comes from one of the reader's last `pair_buffer` documents, not from any document of the
  corpus.
- Examples are shuffled within `shuffle_buffer` examples, not across the whole corpus.
- The stream repeats without end, each pass with other random draws; `trainer.max_steps` ends training. So no
  device runs out of data before another, which would stall DDP.
- The first `validation_documents` documents are held out as the validation split, in memory; each reader reads
  them too, and skips every document of its share with the same text (by a 16-byte digest).
With `examples="chunks"` a reader cuts each document into consecutive chunks (`create_chunks_from_document`)
instead of making sentence pairs; then nothing is drawn from other documents.
- A resumed run fast-forwards: each reader makes its examples again up to the batch after the checkpoint, and
  masking and the training step are skipped for them. Reading the stream again costs time, not correctness.

`StreamedExamples` is the DataModule's source of them (`task.datamodule.streaming=true`); `StreamingExamples` is one
reader's.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.tasks.pretraining.corpus import Corpus
from lightbert.tasks.pretraining.examples import create_chunks_from_document, create_instances_from_document
from lightbert.tasks.pretraining.resumable import Position, example_seed


def tokenized(document: list[str], tokenizer: BertTokenizer) -> list[list[int]]:
    return [ids for ids in tokenizer.encode_batch(document) if ids] if document else []


def held_out_examples(
    documents: Iterable[list[str]],
    tokenizer: BertTokenizer,
    max_seq_length: int,
    short_seq_prob: float,
    seed: int,
    examples: str = "pairs",
) -> list[dict]:
    """The validation split: every pair of the first documents of the stream (NotNext drawn among them), or every
    chunk of them (`examples="chunks"`)."""
    docs = [d for d in (tokenized(document, tokenizer) for document in documents) if d]
    if examples == "chunks":
        cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
        return [c for d in docs for c in create_chunks_from_document(flat(d), max_seq_length, cls_id, sep_id)]
    examples = []
    for index in range(len(docs)):
        rng = random.Random(f"{seed}/validation/{index}")
        examples += create_instances_from_document(
            docs, index, max_seq_length, short_seq_prob, rng, tokenizer.cls_id, tokenizer.sep_id
        )
    return examples


def flat(sentences: list[list[int]]) -> list[int]:
    """A tokenized document's sentences end to end."""
    return [token for sentence in sentences for token in sentence]


def _digest(document: list[str]) -> bytes:
    return hashlib.blake2b("\n".join(document).encode(), digest_size=16).digest()


class StreamingExamples(IterableDataset):
    """This reader's examples, from `start_batch` on, each with its `mask_seed`; endless (passes over the stream)."""

    def __init__(
        self,
        stream: Callable[..., Iterator[list[str]]],
        tokenizer: BertTokenizer,
        max_seq_length: int,
        short_seq_prob: float,
        seed: int,
        batch_size: int,
        skip_documents: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        shuffle_buffer: int = 10000,
        pair_buffer: int = 1000,
        examples: str = "pairs",
    ):
        self.stream, self.tokenizer, self.seed = stream, tokenizer, seed
        self.max_seq_length, self.short_seq_prob, self.batch_size = max_seq_length, short_seq_prob, batch_size
        self.skip_documents, self.rank, self.world_size = skip_documents, rank, world_size
        self.start_batch, self.shuffle_buffer, self.pair_buffer = start_batch, shuffle_buffer, pair_buffer
        self.examples = examples  # "pairs" or "chunks"

    def _reader(self) -> tuple[int, int, int, int]:
        """(this reader, readers in the run, this DataLoader worker, workers of this device)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * workers + worker, self.world_size * workers, worker, workers

    def documents(self, reader: int, readers: int) -> Iterator[tuple[int, list[list[int]]]]:
        """This reader's share of one pass over the stream (`stream(shard=(reader, readers))`), without the held-out
        documents: (document number within the share, tokenized sentences)."""
        held_out = set()
        if self.skip_documents:
            held_out = {_digest(document) for document in islice(self.stream(), self.skip_documents)}
        for number, document in enumerate(self.stream(shard=(reader, readers))):
            if held_out and _digest(document) in held_out:
                continue
            sentences = tokenized(document, self.tokenizer)
            if sentences:
                yield number, sentences

    def _no_document(self, reader: int, readers: int) -> str:
        """Why a reader found no training document, as a fix: the validation split took every document of the corpus
        (fewer readers would not help), or this reader's share of those left is empty (fewer readers would)."""
        held_out = {_digest(document) for document in islice(self.stream(), self.skip_documents)}
        documents = [_digest(document) for document in self.stream()]
        if held_out and documents and all(digest in held_out for digest in documents):
            return (
                f"the validation split (task.datamodule.validation_documents={self.skip_documents}) took every "
                f"document of the streamed corpus, and none is left to train on; set "
                f"task.datamodule.validation_documents below the corpus's number of documents, or use a larger corpus"
            )
        return (
            f"the streamed corpus has no document for reader {reader} of {readers} (devices x DataLoader workers) "
            "after the validation documents; use a larger corpus, fewer task.datamodule.num_workers, or fewer "
            "task.datamodule.validation_documents"
        )

    def pairs(self, reader: int, readers: int) -> Iterator[dict]:
        """Sentence pairs (or chunks) in stream order, pass after pass, each pass with its own draws."""
        epoch = 0
        cls_id, sep_id = self.tokenizer.cls_id, self.tokenizer.sep_id
        while True:
            recent: deque[list[list[int]]] = deque(maxlen=self.pair_buffer)
            found = False
            for number, sentences in self.documents(reader, readers):
                found = True
                if self.examples == "chunks":
                    yield from create_chunks_from_document(flat(sentences), self.max_seq_length, cls_id, sep_id)
                    continue
                recent.append(sentences)
                rng = random.Random(f"{self.seed}/{epoch}/{reader}/{number}")
                yield from create_instances_from_document(
                    list(recent),
                    len(recent) - 1,
                    self.max_seq_length,
                    self.short_seq_prob,
                    rng,
                    self.tokenizer.cls_id,
                    self.tokenizer.sep_id,
                )
            if not found:
                raise UserError(self._no_document(reader, readers))
            epoch += 1

    def __iter__(self) -> Iterator[dict]:
        reader, readers, worker, workers = self._reader()
        rng = random.Random(f"{self.seed}/shuffle/{reader}")
        # The DataLoader takes batch i of this device from worker i % workers: skip this worker's part of them.
        skip = len(range(worker, self.start_batch, workers)) * self.batch_size
        buffer: list[dict] = []
        for count, example in enumerate(self._shuffled(self.pairs(reader, readers), rng, buffer)):
            if count >= skip:
                yield {**example, "mask_seed": example_seed(self.seed, f"stream{reader}", count)}

    def _shuffled(self, examples: Iterator[dict], rng: random.Random, buffer: list[dict]) -> Iterator[dict]:
        for example in examples:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(example)
                continue
            index = rng.randrange(len(buffer))
            buffer[index], example = example, buffer[index]
            yield example


@dataclass
class StreamedExamples:
    """Examples made on the fly from the corpus read as a stream; every device and DataLoader worker takes its
    own documents. Nothing is tokenised into the cache."""

    corpus: Corpus
    cache_dir: Path
    max_seq_length: int
    short_seq_prob: float
    seed: int
    validation_documents: int = 1000  # the first documents of the stream, held out
    tokenizer_documents: int = 100000  # the first documents, which a new vocabulary is trained on
    shuffle_buffer: int = 10000  # examples shuffled together
    examples: str = "pairs"  # or "chunks"
    validation_examples: list[dict] | None = None

    def stream(self, shard: tuple[int, int] | None = None):
        """The corpus's documents, read one at a time; with `shard` (index, count) only that reader's share."""
        return self.corpus.stream(self.cache_dir, shard)

    def tokenizer_sample(self) -> tuple[Callable[[], Iterable[list[str]]], list]:
        return self.stream, [self.tokenizer_documents]

    def prepare(self, tokenizer: BertTokenizer) -> None:
        """Nothing to build ahead: the tokenizer, trained and cached once per node, is all."""

    def setup(self, tokenizer: BertTokenizer) -> None:
        if self.validation_examples is None:
            documents = islice(self.stream(), self.validation_documents)
            self.validation_examples = held_out_examples(
                documents, tokenizer, self.max_seq_length, self.short_seq_prob, self.seed, self.examples
            )

    def describe(self) -> str | None:
        """What the console says of chunks (`examples=chunks`): the stream's are cut as it is read."""
        if self.examples != "chunks" or self.validation_examples is None:
            return None
        return (
            f"examples: chunks of at most {self.max_seq_length} tokens, each document's tokens cut in order as the "
            f"stream is read, {len(self.validation_examples):,} held out (task.datamodule.examples=chunks: [CLS] "
            "chunk [SEP], no sentence pairs; short_seq_prob does not apply)"
        )

    def train(self, tokenizer: BertTokenizer, batch_size: int, position: Position) -> tuple[Dataset, None]:
        rank, world_size, accumulate, steps_done = position
        examples = StreamingExamples(
            self.stream,
            tokenizer,
            self.max_seq_length,
            self.short_seq_prob,
            self.seed,
            batch_size,
            skip_documents=self.validation_documents,
            rank=rank,
            world_size=world_size,
            start_batch=steps_done * accumulate,
            shuffle_buffer=self.shuffle_buffer,
            examples=self.examples,
        )
        return examples, None

    def validation(self) -> Sequence[dict]:
        assert self.validation_examples is not None, "call setup() first"
        return self.validation_examples
