"""The BERT WordPiece tokenizer: trained from a corpus, or loaded from `tokenizer.json` or a BERT `vocab.txt`.

Built from `tokenizers` primitives the way `BertWordPieceTokenizer` does (BertNormalizer, BertPreTokenizer,
WordPiece with the `##` continuation prefix). Token ids are always looked up by name: a trained vocabulary
puts the specials first ([PAD]=0 ...), Google's uncased vocab.txt has [PAD]=0 but [CLS]=101.
"""

from __future__ import annotations

import os
import re
import string
import unicodedata
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from lightbert.data.char_normalizer import CharNormalizer, PrenormalizedEncoder
from lightbert.errors import ParameterError, UserError
from lightbert.files import replace_atomically, write_atomically

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SUBWORD_PREFIX = "##"


def _bert_pipeline(model: models.Model, lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    # strip_accents=None follows `lowercase`, as in the original BERT's BasicTokenizer.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=SUBWORD_PREFIX)
    return tokenizer


def train_wordpiece(
    sentences: Collection[str] | Callable[[], Iterable[str]], vocab_size: int = 30522, lowercase: bool = True
) -> BertTokenizer:
    """Learn a WordPiece vocabulary of at most `vocab_size` entries (fewer if the corpus is small).

    The same sentences and settings give the same vocabulary, in the same order, in every process. `sentences` is
    read twice, once by a scan that keeps only the characters it saw: a collection, or a function that returns a
    fresh iterable of them (`train_wordpiece_once` reads an iterable once). Sentences may be joined into longer
    strings at whitespace: the same vocabulary.
    """
    _check_vocab_size(vocab_size)
    if not callable(sentences) and iter(sentences) is sentences:
        raise TypeError("train_wordpiece reads the sentences twice: give a collection or a function that returns them")
    read = sentences if callable(sentences) else lambda: sentences
    normalizer = _char_normalizer(lowercase)
    alphabet = _alphabet(_normalized_chunks(read(), normalizer))
    return _train_numbered(_normalized_chunks(read(), normalizer), alphabet, vocab_size, lowercase)


def train_wordpiece_once(
    sentences: Iterable[str], spill: str | Path, vocab_size: int = 30522, lowercase: bool = True
) -> BertTokenizer:
    """`train_wordpiece` reading `sentences` once (a stream): they are normalised and written to the file `spill`
    while the alphabet is scanned, and the trainer reads them back from it; the file is deleted afterwards."""
    _check_vocab_size(vocab_size)
    spill = Path(spill)
    try:
        with open(spill, "w", encoding="utf-8", newline="\n") as f:
            alphabet = _alphabet(_written(_normalized_chunks(sentences, _char_normalizer(lowercase)), f))
        return _train_numbered(_read_back(spill), alphabet, vocab_size, lowercase)
    finally:
        spill.unlink(missing_ok=True)


def _char_normalizer(lowercase: bool) -> CharNormalizer:
    return CharNormalizer(_bert_pipeline(models.WordPiece(unk_token="[UNK]"), lowercase).normalizer)


def _normalized_chunks(
    sentences: Iterable[str], normalizer: CharNormalizer, chunk_chars: int = 1 << 16
) -> Iterator[str]:
    """The sentences normalised as the trainer's normaliser would, joined by spaces into strings of about
    `chunk_chars` characters. The trainer then runs without a normaliser (`_train(normalized=True)`): the same words,
    in about 60% of its time (`lightbert.data.char_normalizer`). BertNormalizer's clean_text leaves no whitespace but
    " ", so a chunk is one line of the spill file."""
    batch: list[str] = []
    size = 0
    for sentence in sentences:
        batch.append(sentence)
        size += len(sentence)
        if size >= chunk_chars:
            yield " ".join(normalizer.normalize(batch)[0])
            batch, size = [], 0
    if batch:
        yield " ".join(normalizer.normalize(batch)[0])


def _written(chunks: Iterable[str], f) -> Iterator[str]:
    for chunk in chunks:
        f.write(chunk + "\n")
        yield chunk


def _read_back(path: Path, chunk_bytes: int = 1 << 16) -> Iterator[str]:
    # Lines joined into chunks of 64 KB: fewer calls into the trainer, the same words (at a MB a chunk, the
    # normaliser and the trainer slowed down by a quarter: its parallelism is over the strings it is given).
    with open(path, "rb") as f:
        while lines := f.readlines(chunk_bytes):
            yield b"".join(lines).decode("utf-8")


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size <= len(SPECIAL_TOKENS):
        must = f"{{0}} must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}"
        raise ParameterError(must, "vocab_size")


def _train_numbered(
    normalized: Iterable[str], alphabet: tuple[set[str], set[str]], vocab_size: int, lowercase: bool
) -> BertTokenizer:
    # The `tokenizers` trainer numbers the `##x` continuation pieces in hash-map order, and breaks ties between
    # equal pair counts by those numbers (huggingface/tokenizers#1794): two trainings could differ in their order
    # and, at a tie, in their merges. So the pieces are named up front, sorted, and every number and so every tie
    # is decided the same way. `_alphabet`'s scan finds them holding a set of characters, where a first training
    # pass held every distinct word of the corpus (1.2-1.5 KB each) and cost as much as the real one.
    chars, continuing = alphabet
    pieces = sorted(SUBWORD_PREFIX + c for c in continuing)
    trained = _train(normalized, vocab_size, lowercase, reserved=pieces, normalized=True).get_vocab()
    # Renumbered as usual (specials, characters, continuation pieces, then merges in the order they were made),
    # and the pieces are ordinary tokens again, not the reserved tokens they were in training.
    known = {*SPECIAL_TOKENS, *chars, *pieces}
    merges = sorted((t for t in trained if t not in known), key=trained.__getitem__)
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *sorted(chars), *pieces, *merges])}
    model = models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    tokenizer = _bert_pipeline(model, lowercase)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return BertTokenizer(tokenizer)


def _is_bert_punctuation(char: str) -> bool:
    # tokenizers' BertPreTokenizer: `is_ascii_punctuation() || is_punctuation()` (Unicode categories P*).
    return char in string.punctuation or unicodedata.category(char).startswith("P")


def _alphabet(normalized: Iterable[str]) -> tuple[set[str], set[str]]:
    """The trainer's initial alphabet: every character of a word, and those that continue a word (as `##c`).

    From text as the trainer's normaliser leaves it (`_normalized_chunks`), where the only whitespace is " ". The
    pre-tokenizer splits there and around every punctuation character, which is a word of its own. So a character
    continues a word when it follows a character that is neither. A text whose characters are all settled (already
    seen continuing a word, or punctuation, or " ") cannot add to either set and is not scanned: after the first
    chunks of a corpus nearly every one is settled, and the scan costs a regular expression's search of each.
    """
    chars: set[str] = set()
    continuing: set[str] = set()
    punctuation: set[str] = set()
    settled = {" "}
    unsettled = re.compile("[^ ]")  # searching with it costs less than half of a `set` of the text
    first_of_word = re.compile(" [^ ]")
    for text in normalized:
        if not unsettled.search(text):
            continue
        seen = set(text)
        new = seen - chars
        chars.update(new)
        punctuation.update(c for c in new if _is_bert_punctuation(c))
        present = seen & punctuation
        if present:
            text = re.sub("[" + "".join(re.escape(c) for c in present) + "]", " ", text)
        continuing.update(first_of_word.sub("", " " + text))
        settled.update(c for c in seen if c in continuing or c in punctuation)
        unsettled = re.compile("[^" + "".join(re.escape(c) for c in sorted(settled)) + "]")
    chars.discard(" ")
    continuing.discard(" ")
    return chars, continuing


def _train(
    sentences: Iterable[str], vocab_size: int, lowercase: bool, reserved: Iterable[str], normalized: bool = False
) -> Tokenizer:
    """A trained tokenizer; with `normalized`, the sentences are already normalised and the trainer skips it."""
    tokenizer = _bert_pipeline(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100), lowercase)
    if normalized:
        tokenizer.normalizer = None
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *reserved],
        continuing_subword_prefix=SUBWORD_PREFIX,
        show_progress=False,
    )
    before = os.environ.get(PARALLELISM)
    # Set before the trainer's threads start, so that the switch below replaces a value and adds no variable.
    os.environ[PARALLELISM] = "true" if before is None else before
    try:
        tokenizer.train_from_iterator(_then_one_thread(sentences), trainer=trainer)
    finally:
        if before is None:
            del os.environ[PARALLELISM]
        else:
            os.environ[PARALLELISM] = before
    return tokenizer


PARALLELISM = "TOKENIZERS_PARALLELISM"


def _then_one_thread(sentences: Iterable[str]) -> Iterator[str]:
    """The sentences; once the trainer has read them all, `tokenizers` runs on one thread. Counting the words is
    parallel over the chunks read, and worth it; the merge loop that follows hands the thread pool one small job per
    merge (about 30,000), and on the scale benchmark's 50 MB those cost 2.6 CPU-s of threads waiting on each other
    and made it no faster (the trainer: 6.2 CPU-s on one thread, 8.8 on two). `tokenizers` reads the variable at
    every parallel step; the vocabulary does not depend on it."""
    yield from sentences
    os.environ[PARALLELISM] = "false"


def load_tokenizer(path: str | Path, lowercase: bool = True) -> BertTokenizer:
    """Load `tokenizer.json`, a BERT `vocab.txt`, or a directory holding either (tokenizer.json preferred).

    `lowercase` applies to vocab.txt only; a tokenizer.json carries its own normaliser.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise UserError(f"no tokenizer.json or vocab.txt in {path}; give one of them or their directory")
    if not path.is_file():
        raise UserError(f"tokenizer file {path} does not exist; give a tokenizer.json, a vocab.txt or their directory")
    try:
        if path.suffix == ".json":
            tokenizer = Tokenizer.from_file(str(path))
        else:
            model = models.WordPiece.from_file(str(path), unk_token="[UNK]", max_input_chars_per_word=100)
            tokenizer = _bert_pipeline(model, lowercase)
    except Exception as error:
        raise UserError(f"could not read tokenizer {path}: {error}") from error
    return BertTokenizer(tokenizer)


@dataclass
class BertTokenizer:
    """A `tokenizers.Tokenizer` plus the ids of BERT's special tokens."""

    backend: Tokenizer

    def __post_init__(self) -> None:
        self.backend.no_padding()
        self.backend.no_truncation()
        missing = [t for t in SPECIAL_TOKENS if self.backend.token_to_id(t) is None]
        if missing:
            raise UserError(f"tokenizer lacks the special token(s) {missing}; a BERT vocabulary needs {SPECIAL_TOKENS}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.backend.token_to_id(t) for t in SPECIAL_TOKENS
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    @property
    def special_ids(self) -> list[int]:
        return [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]

    @cached_property
    def subword_ids(self) -> list[int]:
        """Ids of `##` continuation pieces: the tokens that continue a word (for whole-word masking)."""
        return sorted(i for token, i in self.backend.get_vocab().items() if token.startswith(SUBWORD_PREFIX))

    @cached_property
    def _prenormalized(self) -> PrenormalizedEncoder | None:
        return PrenormalizedEncoder.of(self.backend)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without [CLS]/[SEP]."""
        # The same ids as `encode_batch_fast`, about twice as fast where the normaliser is BERT's (char_normalizer).
        encoder = self._prenormalized
        if encoder is not None:
            return encoder.encode(texts)
        # The fast variant skips offsets, which nothing here reads: the same ids, about 1.5x faster.
        return [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """`encode_batch`'s ids end to end (int64), and how many each text has; faster than lists per text where the
        tokenizer is BERT's (`PrenormalizedEncoder.encode_flat`)."""
        encoder = self._prenormalized
        if encoder is not None:
            return encoder.encode_flat(texts)
        ids = self.encode_batch(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum())), lengths

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.backend.id_to_token(int(i)) for i in ids]

    def save_vocab_txt(self, path: str | Path) -> Path:
        """The vocabulary as a BERT vocab.txt: one token per line, in id order."""
        path = Path(path)
        vocab = sorted(self.backend.get_vocab().items(), key=lambda item: item[1])
        return write_atomically(path, "".join(token + "\n" for token, _ in vocab))

    def save(self, path: str | Path) -> Path:
        # atomic: a crash never leaves a half-written tokenizer.json
        return replace_atomically(Path(path), lambda tmp: self.backend.save(str(tmp)))


def iter_sentences(documents: Iterable[list[str]]) -> Iterator[str]:
    for document in documents:
        yield from document
