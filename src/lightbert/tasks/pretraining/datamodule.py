"""The pre-training DataModule: corpus -> WordPiece tokenizer -> examples -> masked batches.

The examples are the paper's sentence pairs (`examples="pairs"`) or each document's tokens cut in order into chunks
(`examples="chunks"`, the modern recipe's; `lightbert.tasks.pretraining.examples`), from one of two sources, chosen
by `streaming`:

- `CachedExamples` (the default, `lightbert.tasks.pretraining.cache`): built once in `prepare_data` from the whole
  corpus and saved under the cache directory; `setup` only loads them.
- `StreamedExamples` (`lightbert.tasks.pretraining.streaming`): made on the fly from the corpus read as a stream, for
  corpora larger than the disk cache; the first `validation_documents` are held out.

Either way the tokenizer is trained (or loaded) once when first asked for, and masking happens in the collator,
per batch. A validation reads at most `validation_share` of the training batches between two validations (the
same examples every time), so that it costs a few percent of the run however large the held-out split. A resumed
run's training batches start at the one after its checkpoint (`lightbert.tasks.pretraining.resumable`: the
`Position` read from the trainer).
"""

from __future__ import annotations

import gzip
import logging
import math
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from itertools import islice
from multiprocessing.connection import Connection
from pathlib import Path

import datasets
import lightning as L
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from lightbert.cluster.processes import dataloader_worker_init
from lightbert.data.batches import evaluation_shares
from lightbert.data.encoding import check_max_seq_length
from lightbert.data.local_files import cache_writes, digest
from lightbert.data.tokenizer import BertTokenizer, load_tokenizer, train_wordpiece_once
from lightbert.errors import ParameterError, UserError
from lightbert.files import publish_file_once
from lightbert.tasks.pretraining import domain_words
from lightbert.tasks.pretraining.cache import CachedExamples
from lightbert.tasks.pretraining.corpus import Corpus
from lightbert.tasks.pretraining.examples import StoredExamples
from lightbert.tasks.pretraining.masking import MaskingCollator, NextTokenCollator, max_predictions_for
from lightbert.tasks.pretraining.objectives import MaskingShares, check_examples, check_objective
from lightbert.tasks.pretraining.packing import PackingCollator, fixed_row_counts
from lightbert.tasks.pretraining.resumable import Position, SeededExamples, StepResumedLoader
from lightbert.tasks.pretraining.streaming import StreamedExamples

log = logging.getLogger(__name__)

CACHED_TOKENIZER = "tokenizer.json.gz"  # the cache's copy of a trained tokenizer: gzipped compact JSON
TOKENIZER_VERSION = 2  # bump when tokenizer training changes (2: the cached path trains on tokenizer_documents)


def _usable_cores() -> int:
    """The cores this process may run on (a job scheduler's share of the host, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _train_tokenizer_child(
    documents: Callable[[], Iterable[list[str]]],
    path: Path,
    vocab_size: int,
    lowercase: bool,
    limit: int,
    send: Connection,
) -> None:
    try:
        count = {"documents": 0, "sentences": 0, "characters": 0}

        def sentences() -> Iterator[str]:
            for document in islice(documents(), limit):
                count["documents"] += 1
                count["sentences"] += len(document)
                count["characters"] += sum(map(len, document))
                yield from document

        spill = path.parent / f"sample.{os.getpid()}.txt"
        tokenizer = train_wordpiece_once(sentences(), spill, vocab_size=vocab_size, lowercase=lowercase)
        # Training is deterministic; publishing once still matters for two runs started at once on a cold cache:
        # both use the first file, and neither reads one half-written.
        # Compact JSON, gzipped: 0.49 MB for 30,522 tokens as JSON is 0.1-0.2 MB compressed (a run directory's copy
        # stays a plain, indented tokenizer.json). mtime=0: the same bytes for the same vocabulary.
        compressed = gzip.compress(tokenizer.backend.to_str().encode(), mtime=0)
        publish_file_once(path, lambda tmp: tmp.write_bytes(compressed))
        send.send(
            f"tokenizer: {tokenizer.vocab_size} WordPiece tokens trained on the first {count['documents']} documents "
            f"of the corpus ({count['sentences']} sentences, {count['characters'] / 1e6:.1f}M characters; at most "
            f"task.datamodule.tokenizer_documents={limit})"
        )
    except BaseException as error:  # handed to the parent, which raises it as if it had trained itself
        send.send(error)


def _read_cached_tokenizer(path: Path) -> BertTokenizer:
    """The cache's tokenizer: a gzipped tokenizer.json (`CACHED_TOKENIZER`), or a plain one an older version wrote."""
    if path.suffix == ".json":
        return load_tokenizer(path)
    try:
        return BertTokenizer(Tokenizer.from_str(gzip.decompress(path.read_bytes()).decode()))
    except Exception as error:  # a file cut short or damaged: gzip, UTF-8 or JSON errors alike
        raise UserError(f"could not read tokenizer {path}: {error}") from error


class PretrainDataModule(L.LightningDataModule):
    """The tokenizer, one example source (`streaming` picks which; each takes its own settings) and masked batches."""

    @classmethod
    def token_types(cls, settings: Mapping) -> int:
        return 2  # segments A and B of every example

    def __init__(
        self,
        corpus: Corpus,
        cache_dir: str,
        tokenizer: BertTokenizer | None = None,
        tokenizer_path: str | None = None,
        add_words: int | str | None = None,
        vocab_size: int = 30522,
        lowercase: bool = True,
        max_seq_length: int = 128,
        max_predictions_per_seq: int | None = None,
        masked_lm_prob: float = 0.15,
        short_seq_prob: float = 0.1,
        whole_word_masking: bool = False,
        masking: dict[str, float] | None = None,
        objective: str = "mlm_nsp",
        batch_size: int = 32,
        num_workers: int = 2,
        pad_to_multiple_of: int | tuple[int, ...] | None = 8,
        seed: int = 12345,
        first_step: int = 0,
        streaming: bool = False,
        packing: bool = False,
        max_examples_per_row: int = 8,
        examples: str = "pairs",
        # CachedExamples' settings
        dupe_factor: int = 10,
        validation_fraction: float = 0.05,
        preprocessing_workers: int | None = None,
        validation_documents: int = 1000,
        tokenizer_documents: int = 100000,
        validation_share: float | None = 0.05,  # in (0, 1], or None: checked with the run's settings (run.settings)
        # StreamedExamples' settings
        shuffle_buffer: int = 10000,
    ):
        super().__init__()
        check_max_seq_length(max_seq_length)
        if not 0 < masked_lm_prob < 1:
            raise ParameterError(f"{{0}} must be in (0, 1), got {masked_lm_prob}", "masked_lm_prob")
        self.corpus = corpus
        self.cache_dir = Path(cache_dir).expanduser()
        self._tokenizer, self.tokenizer_path = tokenizer, tokenizer_path
        self.add_words = add_words  # lightbert.tasks.pretraining.domain_words: words added to the given tokenizer
        self.vocab_size, self.lowercase = vocab_size, lowercase
        self.max_seq_length = max_seq_length
        # Each row's prediction slots and the cap on its masked tokens; null: from the length and rate (20 at 128).
        enough = max_predictions_for(max_seq_length, masked_lm_prob)
        if max_predictions_per_seq is None:
            max_predictions_per_seq = enough
        if max_predictions_per_seq < 1:
            raise ParameterError(f"{{0}} must be >= 1 (or null: from max_seq_length and masked_lm_prob), got "
                                 f"{max_predictions_per_seq}", "max_predictions_per_seq")  # fmt: skip
        self.capped_slots = None  # what the run says of a cap (run.building.datamodule says it, once)
        if max_predictions_per_seq > enough:
            # Capped, not refused: the slots past a row's budget (round(p x its tokens) <= `enough`) are never filled,
            # so the numbers are the same and the sparse MLM head computes only the rows it needs. A larger value is
            # a natural "no cap", and a recipe's value for 512 tokens meets a phase at 128.
            self.capped_slots = (
                f"task.datamodule.max_predictions_per_seq={max_predictions_per_seq} is more than a row of "
                f"{max_seq_length} tokens can use (at most {max(1, round(masked_lm_prob * (max_seq_length - 2)))} "
                f"predictions at masked_lm_prob={masked_lm_prob}): {enough} prediction slots, as null gives"
            )
            max_predictions_per_seq = enough
        self.max_predictions_per_seq, self.masked_lm_prob = max_predictions_per_seq, masked_lm_prob
        self.whole_word_masking = whole_word_masking
        self.masking = MaskingShares(**(masking or {}))
        check_objective(objective)
        check_examples(examples, objective)
        self.objective = objective  # ltr's batches are not masked
        if packing and objective == "ltr":
            raise ParameterError("{0}=true packs examples for a bidirectional encoder; objective ltr reads no [CLS]",
                                 "packing")  # fmt: skip
        if max_examples_per_row < 1:
            raise ParameterError(f"{{0}} must be >= 1, got {max_examples_per_row}", "max_examples_per_row")
        self.packing, self.max_examples_per_row = (
            packing,
            max_examples_per_row,
        )  # lightbert/tasks/pretraining/packing.py
        self.fixed_rows = False  # packed row counts padded up to a few (CUDA graphs: `run.speed.fix_batch_shapes`)
        self.batch_size, self.num_workers = batch_size, num_workers
        self.pad_to_multiple_of, self.seed = pad_to_multiple_of, seed
        self.first_step = first_step  # the global step this data starts at (a recipe's later phase)
        if tokenizer_documents < 1:
            raise ParameterError(f"{{0}} must be >= 1, got {tokenizer_documents}", "tokenizer_documents")
        self.validation_share, self.validation_documents = validation_share, validation_documents
        self._said_validation = False
        shared = {"max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob, "seed": seed,
                  "examples": examples}  # fmt: skip
        self.examples: CachedExamples | StreamedExamples
        if streaming:
            self.examples = StreamedExamples(
                corpus, self.cache_dir, **shared, validation_documents=validation_documents,
                tokenizer_documents=tokenizer_documents, shuffle_buffer=shuffle_buffer,
            )  # fmt: skip
        else:
            workers = preprocessing_workers or _usable_cores()
            self.examples = CachedExamples(
                corpus, self.cache_dir, **shared, dupe_factor=dupe_factor,
                validation_fraction=validation_fraction, preprocessing_workers=workers,
                tokenizer_documents=tokenizer_documents, validation_documents=validation_documents,
            )  # fmt: skip

    # -- tokenizer ---------------------------------------------------------------------------------------

    @cached_property
    def tokenizer(self) -> BertTokenizer:
        """The given tokenizer (with `add_words`' words), or one trained on this corpus (cached, so every rank and
        rerun shares it)."""
        if self._tokenizer is not None:  # from init_from's checkpoint
            return self._with_added_words(self._tokenizer)
        if self.tokenizer_path:
            try:
                tokenizer = load_tokenizer(self.tokenizer_path, lowercase=self.lowercase)
            except UserError as error:
                raise ParameterError.about("tokenizer_path", error) from None
            return self._with_added_words(tokenizer)
        if self.add_words:
            raise ParameterError("{0} adds words to init_from's vocabulary; a vocabulary trained on the corpus has "
                                 "them already (start from a checkpoint with init_from=...)", "add_words")  # fmt: skip
        documents, sample = self.examples.tokenizer_sample()
        key = digest([TOKENIZER_VERSION, self.corpus.fingerprint, self.vocab_size, self.lowercase, *sample])
        path = self.cache_dir / "tokenizers" / key / CACHED_TOKENIZER
        legacy = path.with_name("tokenizer.json")  # a plain entry written before the gzipped one: still read
        if not path.is_file() and legacy.is_file():
            path = legacy
        if not path.is_file():
            self._train_tokenizer(documents, path)
        try:
            return _read_cached_tokenizer(path)
        except UserError as error:  # a damaged cache file (a full disk, a copy cut short): trained again
            log.warning(f"the cached tokenizer {path} could not be read ({error}); it is trained again")
            path.unlink(missing_ok=True)
            path = path.with_name(CACHED_TOKENIZER)
            self._train_tokenizer(documents, path)
            return _read_cached_tokenizer(path)

    def _with_added_words(self, tokenizer: BertTokenizer) -> BertTokenizer:
        """`tokenizer` with the words `add_words` asks for; a count is of the words of the documents a new vocabulary
        would be trained on (the first `tokenizer_documents`)."""
        if not self.add_words:  # null or 0
            return tokenizer
        documents, _ = self.examples.tokenizer_sample()
        limit = self.examples.tokenizer_documents
        return domain_words.add_words(tokenizer, self.add_words, islice(documents(), limit), limit)

    def _train_tokenizer(self, documents: Callable[[], Iterable[list[str]]], path: Path) -> None:
        """Trains in a forked process: the trainer's memory (about 1.3 KB per distinct word) is the child's, gone
        when it ends, and never inherited by the processes that prepare the examples next."""
        receive, send = multiprocessing.Pipe(duplex=False)
        child = multiprocessing.get_context("fork").Process(
            target=_train_tokenizer_child,
            args=(documents, path, self.vocab_size, self.lowercase, self.examples.tokenizer_documents, send),
        )
        with cache_writes(path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
            child.start()
            send.close()
            try:
                outcome = receive.recv()
            except EOFError:  # it died without a word: killed, most likely for memory
                child.join()
                outcome = UserError(
                    f"training the tokenizer failed: its process ended with exit code {child.exitcode}; if it ran "
                    "out of memory, lower task.datamodule.tokenizer_documents"
                )
            child.join()
            if isinstance(outcome, BaseException):
                raise outcome  # the child's failed write into the cache (a full disk) is said as the cache's
        log.info(outcome)

    # -- examples ----------------------------------------------------------------------------------------

    @property
    def examples_dir(self) -> Path:
        """Where the cached examples are (CachedExamples only)."""
        return self.examples.examples_dir(self.tokenizer)

    @property
    def documents(self) -> datasets.Dataset:
        return self.examples.documents

    @property
    def datasets(self) -> dict[str, StoredExamples] | None:
        return self.examples.datasets

    def prepare_data(self) -> None:
        with cache_writes(self.cache_dir):  # a full disk, a read-only cache: one message
            self.examples.prepare(self.tokenizer)

    def setup(self, stage: str | None = None) -> None:
        said = self.examples.describe()
        self.examples.setup(self.tokenizer)
        described = self.examples.describe()
        if described and described != said and (self.trainer is None or self.trainer.is_global_zero):
            log.info(described)  # once: when the examples are first loaded

    # -- batches -----------------------------------------------------------------------------------------

    def collator(
        self, generator: torch.Generator | None = None
    ) -> MaskingCollator | NextTokenCollator | PackingCollator:
        tokenizer = self.tokenizer
        if self.objective == "ltr":
            return NextTokenCollator(tokenizer.pad_id, self.pad_to_multiple_of)
        masking = self._masking_collator(generator)
        if self.packing:
            counts = fixed_row_counts(self.batch_size, self.max_examples_per_row) if self.fixed_rows else None
            return PackingCollator(masking, self.max_seq_length, self.max_examples_per_row, counts)
        return masking

    def _masking_collator(self, generator: torch.Generator | None) -> MaskingCollator:
        tokenizer = self.tokenizer
        return MaskingCollator(
            vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
            mask_id=tokenizer.mask_id,
            special_ids=tokenizer.special_ids,
            masked_lm_prob=self.masked_lm_prob,
            max_predictions_per_seq=self.max_predictions_per_seq,
            whole_word_masking=self.whole_word_masking,
            subword_ids=tokenizer.subword_ids if self.whole_word_masking else [],
            pad_to_multiple_of=self.pad_to_multiple_of,
            generator=generator,
            shares=self.masking,
        )

    def _loader(self, dataset, sampler, collate_fn=None) -> DataLoader:
        return StepResumedLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            collate_fn=collate_fn or self.collator(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            worker_init_fn=dataloader_worker_init,  # a SIGTERM to the whole process group is the run's to take
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator().manual_seed(self.seed),  # worker seeds never draw from the global RNG
        )

    def _position(self) -> Position:
        trainer = self.trainer
        if trainer is None:  # used outside a Trainer, e.g. in a notebook
            return Position(0, 1, 1, 0)
        steps_done = max(0, trainer.global_step - self.first_step)
        return Position(trainer.global_rank, trainer.world_size, trainer.accumulate_grad_batches, steps_done)

    def train_dataloader(self) -> DataLoader:
        """Batches in `StepSampler`'s order (or the stream's), from the step a resumed run left off at."""
        return self._loader(*self.examples.train(self.tokenizer, self.batch_size, self._position()))

    def validation_examples(self) -> Sequence[dict]:
        """The examples every validation reads: the held-out split, or at most `validation_share` x the training
        batches between two validations x `batch_size` of them, spread evenly over it. The count does not depend on
        the number of devices, so neither do the metrics. An evaluation batch costs about a third of a training
        batch (a forward pass), so the default 0.05 keeps validation under 2% of the time on one device, less on
        several."""
        examples = self.examples.validation()
        interval = self._batches_between_validations()
        if self.validation_share is None or interval is None:
            return examples
        most = max(1, math.ceil(self.validation_share * interval)) * self.batch_size
        if most >= len(examples):
            return examples
        spread = [i * len(examples) // most for i in range(most)]
        return [examples[i] for i in spread] if isinstance(examples, list) else examples.select(spread)

    def _batches_between_validations(self) -> int | None:
        trainer = self.trainer
        if trainer is None:
            return None
        interval = trainer.val_check_interval
        if isinstance(interval, int):
            return interval
        if self.datasets is None:  # a fraction of an epoch, and a stream has no epochs
            return None
        return int(interval * len(self.datasets["train"]) // (self.batch_size * trainer.world_size))

    def val_dataloader(self) -> DataLoader:
        # The same masks at every validation and on any number of devices, so validation metrics compare.
        examples = self.validation_examples()
        held_out = len(self.examples.validation())
        if not self._said_validation:
            self._said_validation = True
            log.info(
                f"validation: {len(examples)} of {held_out} held-out examples at every validation (held out: at most "
                f"task.datamodule.validation_documents={self.validation_documents} documents; read: "
                f"validation_share={self.validation_share} x {self._batches_between_validations()} training batches "
                f"between validations x batch {self.batch_size})"
            )
        validation = SeededExamples(examples, self.seed, epoch="validation")
        return self._loader(*evaluation_shares(validation, self.collator(), self.batch_size))
