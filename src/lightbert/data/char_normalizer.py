"""BERT's normaliser as a table of characters: the text `tokenizers`' BertNormalizer gives, at a fraction of its cost.

`tokenizers` normalises through a `NormalizedString`, which keeps an alignment for every character: more than half
of what encoding a sentence costs (measured on the scale benchmark's corpus: 0.9 CPU-s per 5 MB encoding text that
is already normalised, 1.9 s encoding it raw). Nothing here reads offsets. Every step of BertNormalizer acts on one
character at a time: clean_text drops a character or maps it to " ", CJK characters are padded with spaces,
lowercasing is per character (`char::to_lowercase`), and accents go by NFD and then dropping the Mn marks. The one
exception is NFD's canonical ordering, which sorts runs of combining marks; it can only change the text where a
combining mark outlives the stripping. So each distinct character's normal form is asked of the Rust normaliser
itself, once, and a text is translated with the table (`str.translate`, which works in bulk on ASCII text). A text
holding a character whose normal form has a combining mark (or one that Python's Unicode tables do not know) is
normalised whole by the Rust normaliser instead.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np
from tokenizers import Tokenizer, normalizers

_ASCII_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _same(text: str) -> str:
    return text


class CharNormalizer:
    """`normalize` gives what `normalizer.normalize_str` gives, text by text (see the module docstring)."""

    def __init__(self, normalizer: normalizers.Normalizer):
        self.normalizer = normalizer
        self.table: dict[int, str | None] = {}  # the characters that change; None deletes (ASCII stays in bulk)
        self.known: set[str] = set()
        self.whole: set[str] = set()  # a text holding one of these is normalised whole
        self._learn(map(chr, range(128)))
        # Printable ASCII is lowercased or kept by BERT's normaliser (lowercase or not): an ASCII text without control
        # characters is then normalised by `str.lower` or not at all, ten times faster than by the table.
        printable = "".join(map(chr, range(0x20, 0x7F)))
        normal = printable.translate(self.table)
        self.printable_ascii = {printable: _same, printable.lower(): str.lower}.get(normal)

    def _learn(self, chars: Iterable[str]) -> None:
        for char in chars:
            normal = self.normalizer.normalize_str(char)
            if normal != char:
                self.table[ord(char)] = normal or None
            if any(unicodedata.combining(c) or unicodedata.category(c) == "Cn" for c in normal):
                self.whole.add(char)
            self.known.add(char)

    def normalize(self, texts: Sequence[str]) -> tuple[list[str], list[int]]:
        """The texts normalised, and the indices of those that were normalised whole by the Rust normaliser."""
        joined = "".join(texts)
        whole: list[int] = []
        if not joined.isascii():  # ASCII: every character is in the table from the start
            present = set("".join([text for text in texts if not text.isascii()]))
            if not present <= self.known:
                self._learn(present - self.known)
            if not self.whole.isdisjoint(present):
                whole = [i for i, text in enumerate(texts) if not self.whole.isdisjoint(text)]
        if self.printable_ascii is not None and not _ASCII_CONTROL.search(joined):
            ascii_text = self.printable_ascii
            normalized = [ascii_text(text) if text.isascii() else text.translate(self.table) for text in texts]
        else:
            normalized = [text.translate(self.table) for text in texts]
        for i in whole:
            normalized[i] = self.normalizer.normalize_str(texts[i])
        return normalized, whole


class PrenormalizedEncoder:
    """Token ids as `tokenizer.encode_batch_fast(texts, add_special_tokens=False)` gives them, with the texts
    normalised by a `CharNormalizer` and encoded by a copy of the tokenizer without its normaliser.

    Added tokens (BERT's [CLS], [MASK], ...) are matched in the raw text, before the normaliser: a text holding one,
    raw or normalised, is encoded by the tokenizer itself, as is a text the Rust normaliser takes whole."""

    GROUP = 32  # texts encoded as one string by `encode_flat`

    def __init__(self, tokenizer: Tokenizer, added: list[dict]):
        self.tokenizer = tokenizer
        self.chars = CharNormalizer(tokenizer.normalizer)
        self.bare = Tokenizer.from_str(tokenizer.to_str())
        self.bare.normalizer = None
        longest_first = sorted((token["content"] for token in added), key=len, reverse=True)
        self.added = re.compile("|".join(map(re.escape, longest_first))) if added else None
        # `encode_flat` joins texts with BERT's [SEP], which the tokenizer matches as an added token: each text is
        # then encoded as if alone. Only where the added tokens are BERT's: a match of one of them ("[XXX]", no
        # bracket inside) cannot straddle the end of a text and a [SEP], so every [SEP] in the ids is a separator.
        sep = [token for token in added if token["content"] == "[SEP]"]
        bert_only = {token["content"] for token in added} <= {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
        plain = sep and not any(sep[0].get(flag) for flag in ("single_word", "lstrip", "rstrip"))
        self.separator = (sep[0]["content"], sep[0]["id"]) if bert_only and plain else None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> PrenormalizedEncoder | None:
        """An encoder for `tokenizer`, or None where its normaliser is not BertNormalizer (or an added token is matched
        after normalising, which the bare copy could not do the same way)."""
        config = json.loads(tokenizer.to_str())
        if (config.get("normalizer") or {}).get("type") != "BertNormalizer":
            return None
        added = config.get("added_tokens") or []
        if any(token.get("normalized", False) for token in added):
            return None
        return cls(tokenizer, added)

    def _normalize(self, texts: Sequence[str]) -> tuple[list[str], list[int]]:
        """The texts normalised, and the indices (in order) of those the tokenizer itself must encode."""
        normalized, whole = self.chars.normalize(texts)
        raw = set(whole)
        if self.added is not None and (self.added.search("\n".join(texts)) or self.added.search("\n".join(normalized))):
            raw.update(i for i, (a, b) in enumerate(zip(texts, normalized, strict=True))
                       if self.added.search(a) or self.added.search(b))  # fmt: skip
        return normalized, sorted(raw)

    def _encode_raw(self, texts: Sequence[str], raw: list[int]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch_fast([texts[i] for i in raw], add_special_tokens=False)]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        normalized, raw = self._normalize(texts)
        ids = [e.ids for e in self.bare.encode_batch_fast(normalized, add_special_tokens=False)]
        for i, own in zip(raw, self._encode_raw(texts, raw), strict=True):
            ids[i] = own
        return ids

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of every text end to end (int64), and how many each text has: `encode`'s lists, concatenated.

        Texts are encoded `GROUP` at a time as one string, joined by [SEP]s that are then taken out: the same ids, in
        about 70% of the time, for `tokenizers` spends much of its time per string it is given and per `Encoding`
        it returns (a sentence of a pre-training corpus is about 20 tokens)."""
        if self.separator is None:
            ids = self.encode(texts)
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum())), lengths
        normalized, raw = self._normalize(texts)
        for i in raw:
            normalized[i] = ""  # its ids are put in below
        separator, separator_id = self.separator
        strings = [separator.join(normalized[i : i + self.GROUP]) + separator
                   for i in range(0, len(normalized), self.GROUP)]  # fmt: skip
        encoded = self.bare.encode_batch_fast(strings, add_special_tokens=False)
        ids = np.fromiter(chain.from_iterable(e.ids for e in encoded), dtype=np.int64)
        separators = np.flatnonzero(ids == separator_id)
        assert len(separators) == len(texts), "every text ends at its own separator"
        ends = separators - np.arange(len(separators))  # where each text ends once the separators are out
        ids = np.delete(ids, separators)
        lengths = np.diff(ends, prepend=0)
        if raw:
            own = self._encode_raw(texts, raw)
            counts = np.fromiter(map(len, own), dtype=np.int64, count=len(own))
            ids = np.insert(ids, np.repeat(ends[raw], counts), np.fromiter(chain.from_iterable(own), dtype=np.int64))
            lengths[raw] = counts
        return ids, lengths
