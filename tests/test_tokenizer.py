"""WordPiece: trained from a corpus, saved, and loaded back from tokenizer.json or a BERT vocab.txt."""

import json
import random
import subprocess
import sys

import pytest

from lightbert.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece
from lightbert.errors import UserError

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Pre-training deep bidirectional transformers for language understanding.",
    "Masked language models predict tokens that were hidden.",
] * 50


def test_train_save_and_load_round_trip(tmp_path):
    tokenizer = train_wordpiece(SENTENCES, vocab_size=200)
    assert tokenizer.vocab_size <= 200
    assert [tokenizer.backend.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    ids = tokenizer.encode_batch(["The QUICK fox, understanding!"])[0]
    assert tokenizer.cls_id not in ids and tokenizer.sep_id not in ids  # no specials added
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[:2] == ["the", "quick"]  # lower-cased by the BERT normaliser
    loaded = load_tokenizer(tokenizer.save(tmp_path / "tokenizer.json"))
    assert loaded.encode_batch(["The QUICK fox, understanding!"])[0] == ids
    assert any(t.startswith("##") for t in tokenizer.convert_ids_to_tokens(tokenizer.subword_ids))


def test_cased_option_keeps_case():
    tokenizer = train_wordpiece(SENTENCES, vocab_size=300, lowercase=False)
    assert "The" in tokenizer.convert_ids_to_tokens(tokenizer.encode_batch(["The dog"])[0])


def test_loads_a_bert_vocab_txt(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog", "un", "##der", "##stand", ",", "!"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = load_tokenizer(tmp_path)  # a directory holding vocab.txt
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode_batch(["The dog, understand!"])[0]) == [
        "the",
        "dog",
        ",",
        "un",
        "##der",
        "##stand",
        "!",
    ]
    assert (tokenizer.cls_id, tokenizer.mask_id) == (2, 4)


def test_missing_or_unusable_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(UserError, match="no tokenizer.json or vocab.txt"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("the\ndog\n")
    with pytest.raises(UserError, match="lacks the special token"):
        load_tokenizer(tmp_path / "vocab.txt")


# Many words of equal counts: the `tokenizers` trainer alone gave each process its own vocabulary order here.
TIES = """
import json, random, sys
from lightbert.data.tokenizer import train_wordpiece
rng = random.Random(0)
syllables = ["ka", "to", "ri", "mu", "sen", "lo", "pa", "qui", "dra", "vel", "nos", "ter", "ab", "zy", "x"]
words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
sentences = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
tokenizer = train_wordpiece(sentences, vocab_size=int(sys.argv[1]))
print(json.dumps(tokenizer.backend.get_vocab(), sort_keys=True))
"""


@pytest.mark.parametrize("vocab_size", [120, 700])
def test_training_gives_the_same_vocabulary_in_every_process(vocab_size):
    vocabs = [
        json.loads(subprocess.run([sys.executable, "-c", TIES, str(vocab_size)], capture_output=True, text=True,
                                  check=True).stdout)
        for _ in range(3)
    ]  # fmt: skip
    assert vocabs[0] == vocabs[1] == vocabs[2]
    order = sorted(vocabs[0], key=vocabs[0].__getitem__)
    assert order[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    pieces = [t for t in order if t.startswith("##") and len(t) == 3]
    assert pieces == sorted(pieces) and len(order) == vocab_size


def test_training_refuses_sentences_it_cannot_read_twice():
    with pytest.raises(TypeError, match="reads the sentences twice"):
        train_wordpiece(iter(SENTENCES), vocab_size=200)


def _two_pass_vocabulary(sentences, vocab_size, lowercase):
    """The vocabulary as lightbert trained it before the alphabet scan: a first training pass found the alphabet."""
    from lightbert.data.tokenizer import SUBWORD_PREFIX, _train

    alphabet = _train(sentences, len(SPECIAL_TOKENS) + 1, lowercase, reserved=()).get_vocab()
    pieces = sorted(t for t in alphabet if t.startswith(SUBWORD_PREFIX))
    chars = sorted(t for t in alphabet if t not in SPECIAL_TOKENS and not t.startswith(SUBWORD_PREFIX))
    trained = _train(sentences, vocab_size, lowercase, reserved=pieces).get_vocab()
    merges = sorted((t for t in trained if t not in alphabet), key=trained.__getitem__)
    return {token: i for i, token in enumerate([*SPECIAL_TOKENS, *chars, *pieces, *merges])}


@pytest.mark.parametrize("lowercase", [True, False])
def test_the_alphabet_scan_gives_the_vocabulary_of_a_first_training_pass(lowercase):
    rng = random.Random(5)
    # Accents and combining marks, CJK (a word per character), Unicode punctuation (a word of its own), symbols
    # that are not punctuation (part of a word), control characters (dropped), emoji, odd whitespace.
    extras = ["Café", "naïve", "e\u0301te\u0301", "東京大学", "«quoted»", "a—b", "x©y", "±5", "tab\there",
              "nul\x00l", "🙂ok", "ǅemal", "İstanbul", "ß", "\u00a0gap", "don't", "x\u2028y", "$12.50", "ﬁne",
              "ÅNGSTRÖM"]  # fmt: skip
    sentences = [
        " ".join(rng.choice(extras) if rng.random() < 0.3 else rng.choice(SENTENCES).split()[rng.randrange(7)]
                 for _ in range(rng.randint(1, 15)))
        for _ in range(400)
    ]  # fmt: skip
    for vocab_size in (150, 400):
        trained = train_wordpiece(sentences, vocab_size=vocab_size, lowercase=lowercase).backend.get_vocab()
        assert trained == _two_pass_vocabulary(sentences, vocab_size, lowercase)
    # Sentences joined into longer strings (as a tokenizer sample is read back from its file): the same words.
    joined = ["\n".join(sentences[i : i + 7]) for i in range(0, len(sentences), 7)]
    assert train_wordpiece(joined, vocab_size=400, lowercase=lowercase).backend.get_vocab() == trained
