"""The examples cache: pre-training examples built once from the whole corpus and saved under the cache directory,
keyed by everything they depend on (`CachedExamples`, the default source of `PretrainDataModule`; the other is the
stream, `lightbert.tasks.pretraining.streaming.StreamedExamples`).

They are built once in `prepare_data` (local rank 0 of each node): a corpus of files tokenized as it is read, with no
copy of the text; a Hugging Face one through `datasets.map`. `setup` only loads them. The tokenized documents are
stored once and each example as offsets into them (`PairExamples`, `ChunkExamples`), so `dupe_factor` pairings per
document cost 21 bytes an example. `validation_fraction` of the documents are held out (at most
`validation_documents`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset, Sampler

from lightbert.data.local_files import cache_writes, digest, progress_bars_for
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import ParameterError, UserError
from lightbert.files import publish_directory
from lightbert.tasks.pretraining.corpus import Corpus, byte_shares, check_has_documents, read_pieces
from lightbert.tasks.pretraining.examples import (
    EXAMPLE_KINDS,
    StoredDocuments,
    StoredExamples,
    create_pretraining_chunks,
    create_pretraining_pairs,
)
from lightbert.tasks.pretraining.resumable import Position, SeededExamples, StepSampler

log = logging.getLogger(__name__)

# Bump when example creation changes, so cached examples are rebuilt. 3: binomial truncation; 4: documents stored once
# (uint16 ids) and examples as offsets into them, read through MANIFEST.
EXAMPLES_VERSION = 4
MANIFEST = "examples.json"  # the files of an examples cache entry


def _file_names(dataset: datasets.Dataset) -> list[str]:
    return [Path(f["filename"]).name for f in dataset.cache_files]


def _tokenize_documents(batch: dict, tokenizer: BertTokenizer, id_type: str) -> pa.Table:
    """Token ids of every sentence; empty sentences dropped, and documents left with none (fewer rows out). Built as
    Arrow arrays from numpy: datasets would convert nested lists of Python ints one int at a time."""
    documents = batch["sentences"]
    tokens, lengths = tokenizer.encode_flat([s for document in documents for s in document])
    tokens = tokens.astype(id_type)
    owner = np.repeat(np.arange(len(documents)), [len(document) for document in documents])
    kept = lengths > 0
    per_document = np.bincount(owner[kept], minlength=len(documents))
    sentences = pa.ListArray.from_arrays(
        np.concatenate([[0], np.cumsum(lengths[kept])]).astype(np.int32), pa.array(tokens)
    )
    column = pa.ListArray.from_arrays(
        np.concatenate([[0], np.cumsum(per_document[per_document > 0])]).astype(np.int32), sentences
    )
    return pa.table({"sentence_ids": column})


# About the bytes of text of a document of a BERT-format corpus (Wikipedia's articles are ~4 KB), for the processes a
# corpus of files is tokenized by: as many documents a process as `CachedExamples._num_proc` asks of a map's.
BYTES_PER_DOCUMENT = 2000


def _tokenize_share(pieces: list, tokenizer: BertTokenizer, features: datasets.Features, path: str) -> None:
    """The documents of one share of the corpus's bytes, tokenized (`_tokenize_documents`) a batch of 1,000 at a time
    and written to the Arrow file `path`."""
    from datasets.arrow_writer import ArrowWriter

    id_type = features["sentence_ids"].feature.feature.dtype
    with ArrowWriter(features=features, path=path) as writer:
        documents = read_pieces(pieces)
        while batch := list(islice(documents, 1000)):
            writer.write_table(_tokenize_documents({"sentences": batch}, tokenizer, id_type))
        writer.finalize()


@dataclass
class CachedExamples:
    """Examples built once from the whole corpus and cached; shuffled by `StepSampler`, resumable by step."""

    corpus: Corpus
    cache_dir: Path
    max_seq_length: int
    short_seq_prob: float
    seed: int
    dupe_factor: int = 10
    validation_fraction: float = 0.05
    preprocessing_workers: int = 1
    tokenizer_documents: int = 100000  # the first documents, which a new vocabulary is trained on
    validation_documents: int = 1000  # at most this many held out
    examples: str = "pairs"  # or "chunks" (`lightbert.tasks.pretraining.examples`)
    datasets: dict[str, StoredExamples] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.validation_fraction < 1:
            raise ParameterError(f"{{0}} must be in (0, 1), got {self.validation_fraction}", "validation_fraction")
        if self.validation_documents < 1:
            raise ParameterError(f"{{0}} must be >= 1, got {self.validation_documents}", "validation_documents")

    def tokenizer_sample(self) -> tuple[Callable[[], Iterable[list[str]]], list]:
        """The documents a new vocabulary is trained on (the first `tokenizer_documents`), and what else its cache
        key needs. Files are read as the trainer asks (nothing is read where the tokenizer is cached)."""
        files = self._files()
        if files is not None:

            def read_files() -> Iterator[list[str]]:
                documents = read_pieces([(path, 0, path.stat().st_size) for path in files])
                first = next(documents, None)
                check_has_documents(iter([first] if first is not None else []))
                yield first
                yield from documents

            return read_files, [self.tokenizer_documents]
        documents = self.documents  # loaded here, before the training process forks: read by both
        first = documents.select(range(min(self.tokenizer_documents, len(documents))))

        def read() -> Iterator[list[str]]:
            for batch in first.iter(batch_size=1000):
                yield from batch["sentences"]

        return read, [self.tokenizer_documents]

    @cached_property
    def documents(self) -> datasets.Dataset:
        """The corpus as a dataset of documents, loaded once: what a Hugging Face corpus is tokenized from (its
        tokenizer trained on). Corpora of files are read from the files instead (`_files`), with no copy of the
        text in the cache. First read for the tokenizer, outside `prepare_data`: its cache's writes fail in one
        message here too."""
        with cache_writes(self.cache_dir):
            return self.corpus.load(self.cache_dir, num_proc=self.preprocessing_workers)

    def _files(self) -> list[Path] | None:
        """The corpus's BERT-format files (text, demo), which the examples are tokenized from as they are read;
        None for a Hugging Face corpus (`documents`)."""
        files = getattr(self.corpus, "files", None)
        return files(self.cache_dir) if files is not None else None

    def examples_dir(self, tokenizer: BertTokenizer) -> Path:
        """The cache entry of these examples, keyed by everything they depend on. Chunks are keyed apart from pairs
        (their kind is in the key, and their entry's MANIFEST says it again) and by what they depend on: not
        `short_seq_prob` or `dupe_factor`, which only pairs read."""
        tokens = hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()
        # Pairs keep the key they have always had, so their cache entries stay valid.
        pairing = ["chunks"] if self.examples == "chunks" else [self.short_seq_prob, self.dupe_factor]
        key = digest(
            [
                EXAMPLES_VERSION,
                self.corpus.fingerprint,
                tokens,
                self.max_seq_length,
                *pairing,
                self.validation_fraction,
                self.validation_documents,
                self.seed,
            ]
        )
        return self.cache_dir / "examples" / key

    def prepare(self, tokenizer: BertTokenizer) -> None:
        examples_dir = self.examples_dir(tokenizer)
        if (examples_dir / MANIFEST).is_file():
            return
        with cache_writes(examples_dir):
            publish_directory(examples_dir, lambda tmp: self._write(tokenizer, tmp))

    def _write(self, tokenizer: BertTokenizer, out: Path) -> None:
        """The tokenized documents, once, in the smallest integer type that holds the vocabulary, and each split's
        examples as offsets into them (`create_pretraining_pairs`). Every map writes its files straight into `out`,
        which is renamed into place whole: nothing is copied, so the peak on disk is the cache itself."""
        out.mkdir(parents=True)
        ids = datasets.Value("uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32")
        features = datasets.Features({"sentence_ids": datasets.Sequence(datasets.Sequence(ids))})
        files = self._files()
        if files is not None:
            documents = self._tokenize_files(files, tokenizer, features, out)
        else:
            documents = self.documents
            with progress_bars_for(len(documents)):
                documents = documents.map(
                    _tokenize_documents,
                    batched=True,
                    remove_columns=documents.column_names,
                    fn_kwargs={"tokenizer": tokenizer, "id_type": ids.dtype},
                    features=features,
                    num_proc=self._num_proc(len(documents)),
                    cache_file_name=str(out / "documents.arrow"),
                    load_from_cache_file=False,  # cached as a whole, under a key datasets' hash can't compute
                    desc="Tokenizing sentences",
                )
        if len(documents) < 2:
            raise UserError(
                f"the corpus has {len(documents)} usable document(s) (documents with at least one sentence that "
                "has text); pre-training needs at least 2, for next-sentence pairs and a validation split. "
                "In corpus=text files, separate documents with a blank line"
            )
        share = min(self.validation_documents, max(1, round(self.validation_fraction * len(documents))))
        num_validation = min(len(documents) - 1, share)
        splits = documents.train_test_split(
            test_size=num_validation,
            seed=self.seed,
            train_indices_cache_file_name=str(out / "train_documents.arrow"),  # 8 bytes a document; deleted below
            test_indices_cache_file_name=str(out / "validation_documents.arrow"),
        )
        pairing = {name: getattr(self, name) for name in ("max_seq_length", "short_seq_prob", "dupe_factor", "seed")}
        files = {"documents": _file_names(documents), "examples": self.examples}
        for name, split in (("train", splits["train"]), ("validation", splits["test"])):
            where = {"cache_file_name": str(out / f"{name}.arrow"), "num_proc": self._num_proc(len(split))}
            if self.examples == "chunks":
                made = create_pretraining_chunks(split, self.max_seq_length, **where)
            else:
                made = create_pretraining_pairs(split, **pairing, **where)
            files[name] = _file_names(made)
        for name in ("train_documents.arrow", "validation_documents.arrow"):
            (out / name).unlink(missing_ok=True)  # the pairs name the documents' rows themselves
        (out / MANIFEST).write_text(json.dumps(files))  # last: a directory without it was never finished

    def _tokenize_files(
        self, files: list[Path], tokenizer: BertTokenizer, features: datasets.Features, out: Path
    ) -> datasets.Dataset:
        """The documents of `files` tokenized as they are read, with no copy of the text written: one process per
        contiguous share of the bytes (`byte_shares`), each writing its own Arrow file into `out`, so the documents
        come in the files' order whatever the number of processes. Each holds a batch of documents at a time."""
        size = sum(path.stat().st_size for path in files)
        shares = byte_shares(files, self._num_proc(size // BYTES_PER_DOCUMENT) or 1)
        names = [f"documents-{number:05d}-of-{len(shares):05d}.arrow" for number in range(len(shares))]
        names = names if len(names) > 1 else ["documents.arrow"]
        jobs = [(share, tokenizer, features, str(out / name)) for share, name in zip(shares, names, strict=True)]
        if len(jobs) == 1:
            _tokenize_share(*jobs[0])
        else:
            from concurrent.futures import ProcessPoolExecutor
            from concurrent.futures.process import BrokenProcessPool

            # Not multiprocessing.Pool, which waits forever for the share of a process that was killed.
            fork = multiprocessing.get_context("fork")
            try:
                with ProcessPoolExecutor(len(jobs), mp_context=fork) as processes:
                    list(processes.map(_tokenize_share, *zip(*jobs, strict=True)))
            except BrokenProcessPool:
                raise UserError(
                    f"tokenizing the corpus failed: one of its {len(jobs)} processes ended without a word; if it ran "
                    "out of memory, lower task.datamodule.preprocessing_workers"
                ) from None
        return datasets.concatenate_datasets([datasets.Dataset.from_file(str(out / name)) for name in names])

    def _load(self, examples_dir: Path, tokenizer: BertTokenizer) -> dict[str, StoredExamples]:
        files = json.loads((examples_dir / MANIFEST).read_text())
        kind = files.get("examples", "pairs")  # an entry written before chunks holds pairs
        if kind != self.examples:  # never read as the other kind, whatever put it under this key
            raise ValueError(f"the entry holds {kind}, not {self.examples}")

        def table(names: list[str]) -> datasets.Dataset:
            return datasets.concatenate_datasets([datasets.Dataset.from_file(str(examples_dir / n)) for n in names])

        documents = StoredDocuments(table(files["documents"]), "sentence_ids")
        examples = EXAMPLE_KINDS[kind]
        return {
            name: examples(documents, table(files[name]), tokenizer.cls_id, tokenizer.sep_id)
            for name in ("train", "validation")
        }

    def _num_proc(self, num_rows: int) -> int | None:
        # Forking workers costs about a second per map: worth it from a few MB of text (~1000 documents) on.
        workers = min(self.preprocessing_workers, num_rows // 1000)
        return workers if workers > 1 else None

    def setup(self, tokenizer: BertTokenizer) -> None:
        if self.datasets is not None:
            return
        examples_dir = self.examples_dir(tokenizer)
        try:
            self.datasets = self._load(examples_dir, tokenizer)
            return
        except Exception as error:  # a file cut short by a full disk, a copy that stopped: Arrow raises many kinds
            if (examples_dir / MANIFEST).is_file():
                log.warning(
                    f"the cache entry {examples_dir} could not be read ({type(error).__name__}: {str(error)[:120]}); "
                    "it is rebuilt"
                )
        shutil.rmtree(examples_dir, ignore_errors=True)
        self.prepare(tokenizer)
        self.datasets = self._load(examples_dir, tokenizer)

    def describe(self) -> str | None:
        """What the console says of chunks (`examples=chunks`), once the examples are loaded: how many were cut."""
        if self.examples != "chunks" or self.datasets is None:
            return None
        train, validation = self.datasets["train"], self.datasets["validation"]
        return (
            f"examples: {len(train):,} training and {len(validation):,} held-out chunks of at most "
            f"{self.max_seq_length} tokens, {len(train.documents):,} documents' tokens cut in order "
            f"(task.datamodule.examples=chunks: [CLS] chunk [SEP], no sentence pairs; dupe_factor and short_seq_prob "
            "do not apply)"
        )

    def train(self, tokenizer: BertTokenizer, batch_size: int, position: Position) -> tuple[Dataset, Sampler]:
        assert self.datasets is not None, "call setup() first"
        train = self.datasets["train"]
        sampler = StepSampler(len(train), batch_size, self.seed, *position)
        return SeededExamples(train, self.seed), sampler

    def validation(self) -> Sequence[dict]:
        assert self.datasets is not None, "call setup() first"
        return self.datasets["validation"]
