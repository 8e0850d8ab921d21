"""BERT's input format, written once: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` with segment ids 0 and 1.

Every task builds its inputs with `encode_pair`: GLUE's sentence pairs, SWAG's (context, ending) pairs, SQuAD's
(question, context window), NER's single sentences, pre-training's sentence pairs and feature extraction's lines.
"""

from __future__ import annotations

from lightbert.errors import ParameterError

IGNORE_INDEX = -100  # labels of positions the loss ignores (PyTorch's cross_entropy default)
SPECIAL_TOKENS_SINGLE = 2  # [CLS] a [SEP]
SPECIAL_TOKENS_PAIR = 3  # [CLS] a [SEP] b [SEP]
# The shortest sequence a task takes by default: a pair's three special tokens and room for a few of each text's.
MIN_SEQ_LENGTH = 8


def check_max_seq_length(max_seq_length: int, minimum: int = MIN_SEQ_LENGTH, positions: int | None = None) -> None:
    """The one rule for every `max_seq_length` (pre-training, each fine-tuning family, predict.py): at least the
    task's `minimum`, and at most the model's `positions` where the model is known."""
    if max_seq_length < minimum:
        raise ParameterError(f"{{0}} must be at least {minimum}, got {max_seq_length}", "max_seq_length")
    if positions is not None and max_seq_length > positions:
        raise ParameterError(
            f"{{0}} ({max_seq_length}) exceeds the model's {positions} positions; shorten the sequences",
            "max_seq_length",
        )


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Cut the longer sequence's end until both fit (the reference's `_truncate_seq_pair`, longest first).

    The same result as dropping one token at a time, computed at once: the time does not grow with how much is cut.
    """
    excess = len(a) + len(b) - max_tokens
    if excess <= 0:
        return list(a), list(b)
    if excess <= abs(len(a) - len(b)):  # only the longer one is cut
        return (list(a[: len(a) - excess]), list(b)) if len(a) > len(b) else (list(a), list(b[: len(b) - excess]))
    # Both end at the shorter one's length, then lose a token in turn, b first (on a tie the reference pops b).
    rest = excess - abs(len(a) - len(b))
    equal = min(len(a), len(b))
    return list(a[: max(0, equal - rest // 2)]), list(b[: max(0, equal - (rest + 1) // 2)])


def encode_pair(a: list[int], b: list[int] | None, cls_id: int, sep_id: int) -> tuple[list[int], list[int]]:
    """(input_ids, token_type_ids) of `[CLS] a [SEP]` or, with `b`, `[CLS] a [SEP] b [SEP]`."""
    ids = [cls_id, *a, sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += [*b, sep_id]
        types += [1] * (len(b) + 1)
    return ids, types


def encode_truncated(
    a: list[int], b: list[int] | None, max_seq_length: int, cls_id: int, sep_id: int
) -> tuple[list[int], list[int]]:
    """`encode_pair` of `a` (and `b`) cut longest-first to `max_seq_length` tokens, special tokens included."""
    if b is None:
        return encode_pair(a[: max_seq_length - SPECIAL_TOKENS_SINGLE], None, cls_id, sep_id)
    return encode_pair(*truncate_pair(a, b, max_seq_length - SPECIAL_TOKENS_PAIR), cls_id, sep_id)
