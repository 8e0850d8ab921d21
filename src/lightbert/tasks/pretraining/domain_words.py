"""A domain's words added to a released checkpoint's WordPiece vocabulary (`task.datamodule.add_words`), as in
exBERT and the vocabulary-expansion line of work: a general vocabulary splits a domain's words into many `##` pieces,
which costs sequence length, and SciBERT found an in-domain vocabulary worth having.

`add_words` is a count or a file of words:

- a count N: the N words of the corpus (its first `tokenizer_documents` documents, the sample a new vocabulary is
  trained on) with the most tokens to save: occurrences x (pieces - 1), the number of tokens the sample would lose if
  the word were one token. A word the vocabulary holds whole saves nothing, and so does one it cannot read at all
  (one [UNK]); ties go by the word, so every process picks the same words.
- a file: one word a line (blank lines skipped), normalised as the tokenizer normalises text (lower-cased for an
  uncased vocabulary). A line the tokenizer would read as several words is refused, naming it, and so is a file
  without words; a word the vocabulary already holds whole is skipped, and counted on the console, and so is a word
  longer than WordPiece reads (`max_input_chars_per_word`, 100 characters: it is [UNK] whatever the vocabulary).

The words are appended to the WordPiece model's vocabulary after its last id (not as "added tokens", which
`tokenizers` matches before splitting text into words): every BERT tokenizer, a `vocab.txt` included, then splits
text with them as the run does, by longest match first, so a word that begins with an added word starts with it
(`netscapes` -> `netscape ##s`). The weights of the new rows are `lightbert.tasks.pretraining.continued`'s.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError

log = logging.getLogger(__name__)

KEY = "task.datamodule.add_words"


@dataclass(frozen=True)
class WordCounts:
    """How often each word of a sample occurs, and into how many pieces a tokenizer splits it."""

    words: list[str]
    counts: np.ndarray  # (W,) occurrences
    pieces: np.ndarray  # (W,) WordPiece tokens of each word

    @property
    def pieces_per_word(self) -> float:
        return float((self.counts * self.pieces).sum() / max(1, self.counts.sum()))


def count_words(
    documents: Iterable[list[str]], tokenizer: BertTokenizer, chunk_chars: int = 1 << 16
) -> tuple[Counter, int]:
    """Occurrences of every word of `documents` (lists of sentences), split into words as `tokenizer` splits text:
    its normaliser (lower-casing, accents), then its pre-tokenizer (whitespace and punctuation); and how many
    documents there were. In chunks of about `chunk_chars` characters: one call into `tokenizers` per chunk, not per
    sentence."""
    backend = tokenizer.backend
    if backend.pre_tokenizer is None:
        raise UserError(f"{KEY}: the tokenizer does not split text into words (it has no pre-tokenizer)")
    counts: Counter = Counter()
    batch: list[str] = []
    size = read = 0

    def flush() -> None:
        text = " ".join(batch)
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        counts.update(word for word, _ in backend.pre_tokenizer.pre_tokenize_str(text))

    for document in documents:
        read += 1
        for sentence in document:
            batch.append(sentence)
            size += len(sentence)
            if size >= chunk_chars:
                flush()
                batch, size = [], 0
    if batch:
        flush()
    return counts, read


def pieces_of(counts: Counter, tokenizer: BertTokenizer) -> WordCounts:
    """`counts`' words with the number of pieces `tokenizer` splits each into (one batched encode)."""
    words = sorted(counts)
    _, pieces = tokenizer.encode_flat(words) if words else (None, np.zeros(0, dtype=np.int64))
    return WordCounts(words, np.array([counts[w] for w in words], dtype=np.int64), pieces)


def most_pieces(counted: WordCounts, n: int) -> list[str]:
    """The `n` words with the most tokens to save, occurrences x (pieces - 1), the largest first; ties by the word."""
    saved = counted.counts * (counted.pieces - 1)
    ranked = sorted((-int(s), w) for s, w in zip(saved, counted.words, strict=True) if s > 0)
    return [w for _, w in ranked[:n]]


@dataclass(frozen=True)
class WordFile:
    """A file of words as read for the vocabulary (`read_word_file`)."""

    words: list[str]  # normalised, in the file's order, each once, none the vocabulary holds whole
    whole: int  # words the vocabulary holds whole already, left out
    too_long: int  # words longer than WordPiece reads (max_input_chars_per_word: [UNK] whatever), left out
    longest: int  # WordPiece's max_input_chars_per_word


def max_input_chars(tokenizer: BertTokenizer) -> int:
    """The longest word WordPiece splits into pieces: a longer one is [UNK] whatever the vocabulary holds."""
    model = json.loads(tokenizer.backend.to_str())["model"]
    return int(model.get("max_input_chars_per_word") or 100)


def read_word_file(path: str | Path, tokenizer: BertTokenizer) -> WordFile:
    """The file's words, normalised as the tokenizer normalises text, in the file's order and each once, and what was
    left out: the words the vocabulary already holds whole, and those longer than WordPiece reads (an added one would
    still be [UNK]). A line that is not one word, a directory or a file without words is refused, naming it."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{KEY}={path} is a directory; give a file of words, one a line (or a count of words)")
    if not path.is_file():
        raise UserError(f"{KEY}={path}: no such file; give a count of words or a file of words, one a line")
    backend = tokenizer.backend
    words: list[str] = []
    whole = too_long = 0
    longest = max_input_chars(tokenizer)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise UserError(f"{KEY}={path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        text = backend.normalizer.normalize_str(line) if backend.normalizer is not None else line
        split = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
        if len(split) != 1:
            raise UserError(
                f"{KEY}={path} line {number}: {line.strip()!r} is {len(split)} words as the tokenizer splits text "
                f"({split[:4]}); give one word a line"
            )
        word = split[0]
        if backend.token_to_id(word) is not None:
            whole += 1
        elif len(word) > longest:
            too_long += 1
        elif word not in words:
            words.append(word)
    if not words and not whole and not too_long:
        raise UserError(f"{KEY}={path} holds no words ({len(lines)} blank line(s)); give a file of words, one a line")
    return WordFile(words, whole, too_long, longest)


def with_words(tokenizer: BertTokenizer, words: list[str]) -> BertTokenizer:
    """`tokenizer` with `words` appended to its WordPiece vocabulary, after its last id, in the order given."""
    state = json.loads(tokenizer.backend.to_str())
    model = state["model"]
    if model.get("type") != "WordPiece":
        raise UserError(f"{KEY} adds words to a WordPiece vocabulary; this tokenizer's model is {model.get('type')}")
    vocab = model["vocab"]
    next_id = tokenizer.backend.get_vocab_size(with_added_tokens=True)
    for word in words:
        if word not in vocab:
            vocab[word] = next_id
            next_id += 1
    return BertTokenizer(Tokenizer.from_str(json.dumps(state)))


def add_words(
    tokenizer: BertTokenizer, add: int | str, documents: Iterable[list[str]], documents_limit: int
) -> BertTokenizer:
    """`tokenizer` with the words `add` asks for (a count of the corpus's words, or a file of words), said on the
    console: how many, which first, the vocabulary's size, and for a count the pieces per word of the sample before
    and after. `documents` are the corpus's first documents (at most `documents_limit`), read for a count only."""
    if isinstance(add, int):
        counts, read = count_words(documents, tokenizer)
        before = pieces_of(counts, tokenizer)
        words = most_pieces(before, add)
        extended = with_words(tokenizer, words)
        after = pieces_of(counts, extended)
        log.info(
            f"vocabulary: {len(words)} words of the corpus added to init_from's {tokenizer.vocab_size} tokens (of "
            f"{KEY}={add}; the words with the most tokens to save, occurrences x (pieces - 1), in the first "
            f"{read} documents, at most "
            f"task.datamodule.tokenizer_documents={documents_limit}), {_first(words)}; pieces per word there "
            f"{before.pieces_per_word:.3f} -> {after.pieces_per_word:.3f}"
        )
        return extended
    read = read_word_file(add, tokenizer)
    extended = with_words(tokenizer, read.words)
    skipped = f"; {read.whole} of its words are one token already, left out" if read.whole else ""
    if read.too_long:
        skipped += (
            f"; {read.too_long} of its words are longer than WordPiece reads (max_input_chars_per_word="
            f"{read.longest} characters: [UNK] whatever the vocabulary holds), left out"
        )
    log.info(
        f"vocabulary: {len(read.words)} words of {KEY}={add} added to init_from's {tokenizer.vocab_size} tokens, "
        f"{_first(read.words)}{skipped}"
    )
    return extended


def _first(words: list[str], shown: int = 8) -> str:
    quoted = ", ".join(repr(w) for w in words[:shown])
    if len(words) > shown:
        return f"first {quoted}, ... ({len(words) - shown} more)"
    return quoted or "none"
