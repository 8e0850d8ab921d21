"""A released checkpoint continued by pre-training (`task=pretrain init_from=...`): what of it the run carries, said
in one console line, and the weights of the words `task.datamodule.add_words` appends to its vocabulary.

The new rows (lightbert.tasks.pretraining.domain_words chooses the words):
- a word's embedding is the mean of the embeddings of the pieces the checkpoint's tokenizer split it into, so at the
  start it stands for about what its pieces did;
- the MLM decoder stays tied to the embeddings (one tensor), so the word is predicted with that row too; its decoder
  bias is the mean of its pieces' biases;
- the checkpoint holds exactly the tokenizer's rows: the model pads its rows to a multiple of 64 itself (tensor
  cores; `lightbert.model.bert.padded_vocab`), never predicts a padding row and never saves one. A checkpoint that
  an earlier lightbert padded (rows past the tokenizer's, each a zero embedding with a decoder bias of -10000, no
  share of the MLM softmax) still loads and grows as it is.
Old tokens keep their rows, so text of old words gives the logits it gave before (over the old tokens).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import NamedTuple

import torch

from lightbert.checkpoints.reading import HeadCarry, Pretrained, load_into
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError

log = logging.getLogger(__name__)

PAD_MULTIPLE = 64  # how far an earlier lightbert padded the rows of added words (the model pads its own now)

EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
DECODER_BIAS = "cls.predictions.bias"
TIED_DECODER = "cls.predictions.decoder.weight"

# The parts of a pre-training model, by their weights' names, in the order the console names them.
PARTS = (
    ("encoder", ("bert.embeddings.", "bert.encoder.")),
    ("pooler", ("bert.pooler.",)),
    ("MLM transform", ("cls.predictions.transform.",)),
    ("MLM decoder bias", (DECODER_BIAS,)),
    ("NSP classifier", ("cls.seq_relationship.",)),
)


def part_of(key: str) -> str | None:
    return next((name for name, prefixes in PARTS if key.startswith(prefixes)), None)


def untied(pretrained: Pretrained) -> bool:
    """Whether the checkpoint's MLM decoder is a weight of its own, not the word embeddings (a Hugging Face
    config.json with tie_word_embeddings false; lightbert's are always tied)."""
    return pretrained.hf_config.get("tie_word_embeddings", True) is False


class Growth(NamedTuple):
    """How the word embeddings grew for added words: the checkpoint's tokens and rows, the words added after its
    last token, and the rows after."""

    tokens_before: int
    words: int
    rows_before: int
    rows_after: int

    def __str__(self) -> str:
        # Rows of the checkpoint past its tokens (an earlier lightbert padded them) take added words first.
        padding = self.rows_after - self.tokens_before - self.words
        grow = (
            f"grow from {self.rows_before} to {self.rows_after} rows"
            if self.rows_after != self.rows_before
            else f"keep their {self.rows_after} rows"
        )
        line = f"the word embeddings {grow}: {self.tokens_before} tokens of init_from and {self.words} added words"
        return line + (f", and {padding} padding rows of init_from's" if padding else "")


def carried_line(model: torch.nn.Module, pretrained: Pretrained, fresh: list[str], growth: Growth | None) -> str:
    """What a pre-training run takes from `pretrained` and what starts fresh, by part, counted in tensors."""
    source = pretrained.source
    expected = [k for k in model.state_dict() if k != TIED_DECODER]
    new = set(fresh)

    def listed(keys: list[str]) -> str:
        counts = Counter(part_of(key) or key for key in keys)
        order = [name for name, _ in PARTS if name in counts] + sorted(set(counts) - {name for name, _ in PARTS})
        names = [f"{name} ({counts[name]}{' tensors' if i == 0 else ''})" for i, name in enumerate(order)]
        return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]

    carried = [k for k in expected if k not in new]
    line = f"init_from={source}: " + (f"carried its {listed(carried)}" if carried else "carried nothing")
    if fresh:
        heads = [k for k in expected if k.startswith("cls.")]
        missing = dict.fromkeys(part_of(k) or k for k in fresh)
        why = "no pre-training heads" if heads and set(heads) <= new else "no " + ", ".join(missing)
        line += f"; {listed(fresh)} start fresh: {source} has {why}"
    left_out = sorted({part_of(k) for k in pretrained.state_dict if k not in set(expected) and part_of(k)})
    if left_out:
        line += f"; not used: its {', '.join(left_out)} (this objective has none)"
    line += "; the MLM decoder is the word embeddings (tied)"
    if untied(pretrained):
        line += f", not {source}'s own decoder (tie_word_embeddings: false), which is left out"
    if growth is not None:
        line += f"; {growth}"
    return line


def check_added_words_fit(pretrained: Pretrained, tokenizer: BertTokenizer, key: str) -> None:
    """Refuses, naming `key`, a checkpoint that added words cannot extend: an untied decoder (which row would the
    new words' predictions come from?), or a tokenizer that is not the checkpoint's size (its ids would not be the
    rows the checkpoint learnt)."""
    if untied(pretrained):
        raise UserError(
            f"{key} extends the word embeddings and the MLM decoder tied to them, and init_from={pretrained.source} "
            "has a decoder of its own (tie_word_embeddings: false); continue it without adding words"
        )
    rows = pretrained.state_dict[EMBEDDINGS].shape[0]
    if not 0 <= rows - tokenizer.vocab_size < 2 * PAD_MULTIPLE:
        raise UserError(
            f"{key}: the tokenizer has {tokenizer.vocab_size} tokens and init_from={pretrained.source} embeds {rows}: "
            "they disagree in size, so it is not the checkpoint's tokenizer (new words go after its last id); use the "
            "tokenizer the checkpoint came with"
        )


def with_added_words(pretrained: Pretrained, tokenizer: BertTokenizer) -> tuple[Pretrained, Growth | None]:
    """`pretrained` with rows for the tokens `tokenizer` has beyond the checkpoint's own tokenizer (words appended by
    `add_words`): as many rows as `tokenizer` has (or the checkpoint, where it holds more); unchanged, and None, when
    it has none."""
    old = pretrained.tokenizer
    if old is None or tokenizer.vocab_size <= old.vocab_size:
        return pretrained, None
    old_vocab, vocab = old.backend.get_vocab(), tokenizer.backend.get_vocab()
    if any(vocab.get(token) != i for token, i in old_vocab.items()):
        raise UserError(
            f"the run's tokenizer is not init_from={pretrained.source}'s with words added (their ids differ); "
            "resume a run with the tokenizer.json it wrote"
        )
    embeddings, bias = pretrained.state_dict[EMBEDDINGS], pretrained.state_dict.get(DECODER_BIAS)
    rows = embeddings.shape[0]
    size = max(rows, tokenizer.vocab_size)
    words = sorted((i, token) for token, i in vocab.items() if i >= old.vocab_size)
    pieces = old.encode_batch([token for _, token in words])
    new_embeddings = embeddings.new_zeros(size, embeddings.shape[1])
    new_embeddings[:rows] = embeddings
    new_bias = None
    if bias is not None:  # a checkpoint without pre-training heads: the fresh head's bias starts at zero anyway
        new_bias = bias.new_zeros(size)  # every row past the checkpoint's is an added word's, set below
        new_bias[:rows] = bias
    for (i, _), ids in zip(words, pieces, strict=True):
        ids = ids or [old.unk_id]
        new_embeddings[i] = embeddings[ids].float().mean(0).to(embeddings.dtype)
        if new_bias is not None:
            new_bias[i] = bias[ids].float().mean().to(bias.dtype)
    state = {**pretrained.state_dict, EMBEDDINGS: new_embeddings}
    if new_bias is not None:
        state[DECODER_BIAS] = new_bias
    config = {**pretrained.config, "vocab_size": size}
    return replace(pretrained, config=config, state_dict=state), Growth(old.vocab_size, len(words), rows, size)


def load_pretrained_weights(
    model: torch.nn.Module, pretrained: Pretrained, tokenizer: BertTokenizer, carry: HeadCarry | None
) -> list[str]:
    """init_from's weights into a run's model: its rows grown for the words `tokenizer` added to its own
    (`with_added_words`), the encoder, and its fine-tuned head where `carry` (`tasks.heads.carry_head`: the head means
    what the task's does) says so; one console line says what was carried, how the labels matched, or why not.
    Returns the weights that start fresh."""
    pretrained, growth = with_added_words(pretrained, tokenizer)
    # With a fine-tuned head, load_into says its line (and what of it starts from init_from's masked-LM head); without
    # (pre-training), what is carried and what starts fresh is said after, in one line.
    fresh = load_into(model, pretrained, carry, say=carry is not None)
    if carry is None:
        log.info(carried_line(model, pretrained, fresh, growth))
    return fresh
