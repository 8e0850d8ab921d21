"""Masking statistics over thousands of sequences: 15% chosen, 80/10/10, never special tokens or padding."""

import itertools
import random

import pytest
import torch

from lightbert.errors import ParameterError
from lightbert.tasks.pretraining.masking import IGNORE_INDEX, MaskingCollator
from lightbert.tasks.pretraining.objectives import MaskingShares

PAD, UNK, CLS, SEP, MASK = range(5)
VOCAB = 1000
SUBWORDS = list(range(800, 1000))  # ids standing for "##" pieces


def make_examples(n: int, seed: int = 0, subword_rate: float = 0.0) -> list[dict]:
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        len_a, len_b = rng.randint(5, 60), rng.randint(5, 60)
        body = [
            rng.randint(800, 999) if rng.random() < subword_rate else rng.randint(5, 799) for _ in range(len_a + len_b)
        ]
        examples.append(
            {
                "input_ids": [CLS, *body[:len_a], SEP, *body[len_a:], SEP],
                "token_type_ids": [0] * (len_a + 2) + [1] * (len_b + 1),
                "next_sentence_label": rng.randint(0, 1),
            }
        )
    return examples


def collator(**kwargs) -> MaskingCollator:
    return MaskingCollator(
        vocab_size=VOCAB,
        pad_id=PAD,
        mask_id=MASK,
        special_ids=[PAD, UNK, CLS, SEP, MASK],
        subword_ids=SUBWORDS,
        generator=torch.Generator().manual_seed(1),
        **kwargs,
    )


def batches(c: MaskingCollator, examples: list[dict], size: int = 64):
    for i in range(0, len(examples), size):
        chunk = examples[i : i + size]
        yield chunk, c(chunk)


def test_fifteen_percent_eighty_ten_ten_never_special():
    c = collator(max_predictions_per_seq=1000)  # no cap: measure the rate itself
    examples = make_examples(4000)
    real = chosen = as_mask = as_random = kept = 0
    for chunk, batch in batches(c, examples):
        original = c.pad(chunk)["input_ids"]
        labels, inputs = batch["labels"], batch["input_ids"]
        predicted = labels != IGNORE_INDEX
        special = torch.isin(original, torch.tensor([PAD, UNK, CLS, SEP, MASK]))
        assert not (predicted & special).any(), "a special token or padding was chosen"
        assert torch.equal(labels[predicted], original[predicted]), "labels must be the original tokens"
        assert torch.equal(inputs[~predicted], original[~predicted]), "unchosen tokens must be untouched"
        real += (~special).sum().item()
        chosen += predicted.sum().item()
        as_mask += (inputs[predicted] == MASK).sum().item()
        kept += (inputs[predicted] == original[predicted]).sum().item()
        replaced = predicted & (inputs != MASK) & (inputs != original)
        assert not torch.isin(inputs[replaced], torch.tensor([PAD, UNK, CLS, SEP, MASK])).any()
        as_random += replaced.sum().item()
    assert chosen / real == pytest.approx(0.15, abs=0.003)
    # Over ~40k choices the standard error is ~0.2 points; allow 1 point.
    assert as_mask / chosen == pytest.approx(0.80, abs=0.01)
    # A random replacement can draw the original token (1 in 995): it then counts as kept.
    assert as_random / chosen == pytest.approx(0.10, abs=0.01)
    assert kept / chosen == pytest.approx(0.10, abs=0.01)


# Appendix C.2, Table 8: MASK / SAME / RND.
TABLE_8 = [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2), (0.8, 0.2, 0.0), (0.0, 0.2, 0.8), (0.0, 0.0, 1.0)]


@pytest.mark.parametrize(("mask", "same", "random"), TABLE_8)
def test_every_masking_share_of_table_8_is_honoured(mask, same, random):
    c = collator(max_predictions_per_seq=1000, shares=MaskingShares(mask=mask, same=same, random=random))
    chosen = as_mask = kept = as_random = 0
    for chunk, batch in batches(c, make_examples(3000, seed=2)):
        original = c.pad(chunk)["input_ids"]
        predicted = batch["labels"] != IGNORE_INDEX
        inputs = batch["input_ids"][predicted]
        chosen += predicted.sum().item()
        as_mask += (inputs == MASK).sum().item()
        kept += (inputs == original[predicted]).sum().item()
        as_random += ((inputs != MASK) & (inputs != original[predicted])).sum().item()
    # ~30k choices: a standard error of at most 0.3 points. A random draw of the original token (1 in 995) counts
    # as kept.
    assert as_mask / chosen == pytest.approx(mask, abs=0.01)
    assert kept / chosen == pytest.approx(same + random / 995, abs=0.01)
    assert as_random / chosen == pytest.approx(random * 994 / 995, abs=0.01)


@pytest.mark.parametrize(
    "shares", [{"mask": 0.8, "same": 0.1, "random": 0.2}, {"mask": -0.1, "same": 1.1, "random": 0}]
)
def test_shares_that_do_not_sum_to_one_are_refused(shares):
    with pytest.raises(ParameterError, match="three shares from 0 to 1 that sum to 1"):
        MaskingShares(**shares)


def test_per_sequence_count_and_cap():
    examples = make_examples(500, seed=2)
    c = collator(max_predictions_per_seq=5)
    for chunk, batch in batches(c, examples):
        counts = (batch["labels"] != IGNORE_INDEX).sum(1)
        real = torch.tensor([len(e["input_ids"]) - 3 for e in chunk])
        expected = (real * 0.15).round().long().clamp(min=1, max=5)
        assert torch.equal(counts, expected)


def test_masks_are_fresh_each_call_and_reproducible_with_a_seed():
    examples = make_examples(32, seed=3)
    first, second = collator()(examples), collator()(examples)
    assert torch.equal(first["labels"], second["labels"])  # same seed, same masks
    c = collator()
    assert not torch.equal(c(examples)["labels"], c(examples)["labels"])  # the next epoch masks anew


def test_padding_batch_layout():
    examples = make_examples(8, seed=4)
    batch = collator(pad_to_multiple_of=8)(examples)
    longest = max(len(e["input_ids"]) for e in examples)
    assert batch["input_ids"].shape[1] == -(-longest // 8) * 8
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        assert batch["attention_mask"][row].sum() == n
        assert batch["token_type_ids"][row, :n].tolist() == example["token_type_ids"]
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
    assert batch["next_sentence_label"].tolist() == [e["next_sentence_label"] for e in examples]


def test_whole_word_masking_takes_all_pieces_of_a_word():
    examples = make_examples(1000, seed=5, subword_rate=0.4)
    c = collator(whole_word_masking=True, max_predictions_per_seq=1000)
    whole_words = total = real = 0
    for chunk, batch in batches(c, examples):
        original = c.pad(chunk)["input_ids"]
        predicted = batch["labels"] != IGNORE_INDEX
        is_piece = torch.isin(original, torch.tensor(SUBWORDS))
        special = torch.isin(original, torch.tensor([PAD, CLS, SEP]))
        for row in range(original.shape[0]):
            # Walk the words: a word is a non-piece token (or a piece after a special token) plus following pieces.
            start = None
            for t in range(original.shape[1] + 1):
                boundary = (
                    t == original.shape[1] or special[row, t] or not is_piece[row, t] or (t > 0 and special[row, t - 1])
                )
                if boundary and start is not None:
                    word = predicted[row, start:t]
                    assert word.all() or not word.any(), "a word was masked in part"
                    whole_words += int(word.all())
                    start = None
                if t < original.shape[1] and not special[row, t] and boundary:
                    start = t
        budget = ((~special).sum(1) * 0.15).round().clamp(min=1)
        assert (predicted.sum(1) <= budget).all(), "whole words never overshoot the 15% budget"
        total += predicted.sum().item()
        real += (~special).sum().item()
    assert whole_words > 0
    assert 0.12 < total / real <= 0.15  # words are taken while they fit, so a little under 15%


@pytest.mark.parametrize(
    ("max_seq_length", "slots", "pairs"),
    [(8, None, True), (64, 1, True), (128, 20, False)],
    ids=["8-tokens", "one-slot-at-64", "single-sentences-20-slots"],
)
def test_every_row_predicts_at_least_one_token_under_whole_word_masking(tmp_path, max_seq_length, slots, pairs):
    """Whole-word masking with a budget smaller than a row's first word in random order once left the row with no
    prediction (70% of rows at 8 tokens, 57% with one slot at 64), and a batch of such rows made the loss NaN. The
    real collator, a vocabulary that splits the corpus's words into pieces, and rows as the examples make them."""
    from helpers.runs import write_bert_corpus

    from lightbert.data.tokenizer import train_wordpiece
    from lightbert.tasks.pretraining.corpus import TextCorpus, read_bert_format
    from lightbert.tasks.pretraining.datamodule import PretrainDataModule

    path = write_bert_corpus(tmp_path / "corpus.txt", num_documents=30)
    sentences = [s for document in read_bert_format(path) for s in document]
    tokenizer = train_wordpiece(sentences, vocab_size=120)  # few whole words: most split into ## pieces
    datamodule = PretrainDataModule(
        TextCorpus([str(path)]), cache_dir=str(tmp_path / "cache"), tokenizer=tokenizer, whole_word_masking=True,
        max_seq_length=max_seq_length, max_predictions_per_seq=slots, num_workers=0,
    )  # fmt: skip
    collate = datamodule.collator(torch.Generator().manual_seed(0))
    room = max_seq_length - (3 if pairs else 2)
    rows = []
    for a, b in itertools.pairwise(sentences):
        ids_a, ids_b = tokenizer.encode_batch([a, b])
        if pairs:
            ids_a, ids_b = ids_a[: max(1, room // 2)], ids_b[: room - min(len(ids_a), max(1, room // 2))]
            ids = [tokenizer.cls_id, *ids_a, tokenizer.sep_id, *ids_b, tokenizer.sep_id]
        else:
            ids = [tokenizer.cls_id, *ids_a[:room], tokenizer.sep_id]
        rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "next_sentence_label": 0})
    assert sum(len(set(row["input_ids"]) & set(tokenizer.subword_ids)) for row in rows) > len(rows)  # many pieces
    without = total = 0
    for start in range(0, len(rows), 32):
        batch = collate(rows[start : start + 32])
        predicted = (batch["labels"] != IGNORE_INDEX).sum(1)
        without += int((predicted == 0).sum())
        total += len(predicted)
        assert (predicted <= datamodule.max_predictions_per_seq).all()
    assert total > 100 and without == 0, f"{without} of {total} rows predict nothing"
