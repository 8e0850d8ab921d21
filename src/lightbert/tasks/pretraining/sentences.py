"""A rule-based English sentence splitter for corpora that come as running text (the `hf` and `demo` corpora).

The original BERT data came pre-split, one sentence per line; for raw text the reference pipelines used
spaCy or NLTK's Punkt. Neither is a dependency here, so this splits after `.`, `!` or `?` (and any closing
quotes or brackets) followed by whitespace and an upper-case letter, digit or opening quote, and does not
split after common abbreviations or single-letter initials. Good enough for NSP pairs; pass pre-split text
through `corpus=text` when it is not.
"""

from __future__ import annotations

import re

_CANDIDATE_BREAK = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al fig figs no nos vol pp ch sec mr mrs ms dr prof sr jr st mt inc ltd co corp jan feb "
    "mar apr jun jul aug sep sept oct nov dec approx dept est".split()
)
_WHITESPACE = re.compile(r"\s+")


def _ends_with_abbreviation(text: str) -> bool:
    last_word = text.rsplit(None, 1)[-1].rstrip(".").lower().lstrip("(\"'")
    if last_word in _ABBREVIATIONS:
        return True
    return len(last_word) == 1 and last_word.isalpha()  # an initial: "J. R. R. Tolkien"


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of running text into sentences, whitespace collapsed."""
    text = _WHITESPACE.sub(" ", text).strip()
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _CANDIDATE_BREAK.finditer(text):
        piece = text[start : match.start()]
        if piece.endswith(".") and _ends_with_abbreviation(piece):
            continue
        sentences.append(piece.strip() + text[match.start() : match.end()].rstrip())  # keep closing quotes
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def split_document(text: str) -> list[str]:
    """Sentences of a document whose paragraphs are separated by newlines."""
    return [sentence for paragraph in text.split("\n") for sentence in split_sentences(paragraph)]
