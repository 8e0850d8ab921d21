"""BERT's normaliser as a character table: the same text and the same token ids as `tokenizers` itself."""

import random

import pytest
from tokenizers import Tokenizer, normalizers

from lightbert.data.char_normalizer import CharNormalizer, PrenormalizedEncoder
from lightbert.data.tokenizer import load_tokenizer, train_wordpiece

WORDS = "The quick brown fox jumps over the lazy dog, understanding masked tokens!".split()
# Accents precomposed and combining, marks that survive accent stripping out of canonical order (U+1D16D sorts after
# U+1D165), CJK, controls that are dropped or become spaces, the special tokens raw and disguised, a final sigma,
# dotted capital I, sharp s, ligatures, odd whitespace, a noncharacter and a private-use character.
ODD = ["Café", "e\u0301te\u0301", "a\u0327\u0301", "x\U0001d16d\U0001d165y", "東京", "nul\x00l", "tab\there",
       "v\x0btab", "\ufffd", "[MASK]", "[mask]", "[MA\x01SK]", "x[CLS]y", "ΟΔΟΣ", "İstanbul", "Straße", "ﬁne",
       "\u00a0", "\u2028", "\U000e0001", "\ufdd0", "\ue000", "🙂ok", "ǅ", "\u2014", "\u2019s"]  # fmt: skip


def texts(seed: int, count: int = 3000) -> list[str]:
    rng = random.Random(seed)
    rare = [chr(rng.randrange(0x80, 0x30000)) for _ in range(400)]
    rare = [c for c in rare if not 0xD800 <= ord(c) < 0xE000]  # no surrogates: not text
    out = []
    for _ in range(count):
        pieces = []
        for _ in range(rng.randint(0, 12)):
            draw = rng.random()
            pieces.append(rng.choice(ODD) if draw < 0.2 else rng.choice(rare) if draw < 0.3 else rng.choice(WORDS))
        out.append(" ".join(pieces) if rng.random() < 0.8 else "".join(pieces))
    return out


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def tokenizer(request):
    return train_wordpiece(WORDS * 20 + ODD * 5, vocab_size=150, lowercase=request.param).backend


def test_the_table_normalises_as_the_rust_normaliser(tokenizer):
    chars = CharNormalizer(tokenizer.normalizer)
    sample = texts(0)
    normalized, whole = chars.normalize(sample)
    assert normalized == [tokenizer.normalizer.normalize_str(t) for t in sample]
    # The out-of-order marks are why some texts are normalised whole: by the table alone, they would differ.
    assert "\U0001d16d" in chars.whole
    reordered = "x\U0001d16d\U0001d165y"
    if tokenizer.normalizer.normalize_str(reordered) != reordered.translate(chars.table):
        assert any(reordered in sample[i] for i in whole)


def test_the_encoder_gives_the_ids_of_the_tokenizer(tokenizer):
    encoder = PrenormalizedEncoder.of(tokenizer)
    assert encoder is not None
    for seed in (1, 2):
        sample = texts(seed)
        expected = [e.ids for e in tokenizer.encode_batch_fast(sample, add_special_tokens=False)]
        assert encoder.encode(sample) == expected
    ascii_only = [" ".join(random.Random(i).choices(WORDS, k=9)) for i in range(200)]
    assert encoder.encode(ascii_only) == [
        e.ids for e in tokenizer.encode_batch_fast(ascii_only, add_special_tokens=False)
    ]
    for seed in (4, 5):  # end to end: the same ids, whatever the texts hold and wherever a group of texts ends
        sample = texts(seed, count=1000 + seed)
        expected = [e.ids for e in tokenizer.encode_batch_fast(sample, add_special_tokens=False)]
        ids, lengths = encoder.encode_flat(sample)
        assert lengths.tolist() == list(map(len, expected))
        assert ids.tolist() == [i for one in expected for i in one]
    assert encoder.separator is not None  # encode_flat joined the texts (BERT's added tokens only)
    mask = tokenizer.token_to_id("[MASK]")
    assert mask in encoder.encode(["a [MASK] b"])[0]  # matched in the raw text, as the tokenizer does
    assert mask not in encoder.encode(["a [MA\x01SK] b"])[0]  # a control character dropped only by the normaliser


def test_a_vocab_txt_and_its_missing_added_tokens(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog", "un", "##der", "##stand", ",", "!", "[", "]"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = load_tokenizer(tmp_path)
    sample = ["The dog, understand!", "[MASK] the dog", "Ünder the dog", *texts(3, 300)]
    expected = [e.ids for e in tokenizer.backend.encode_batch_fast(sample, add_special_tokens=False)]
    assert tokenizer.encode_batch(sample) == expected
    ids, lengths = tokenizer.encode_flat(sample)
    assert lengths.tolist() == list(map(len, expected)) and ids.tolist() == [i for one in expected for i in one]


def test_texts_are_not_joined_where_other_tokens_were_added():
    tokenizer = train_wordpiece(WORDS * 20, vocab_size=100).backend
    tokenizer.add_special_tokens(["a["])  # "banana" + "[SEP]" would hold a match across the end of the text
    encoder = PrenormalizedEncoder.of(tokenizer)
    assert encoder.separator is None
    sample = ["banana", "the dog", "a[ b", *texts(6, 300)]
    expected = [e.ids for e in tokenizer.encode_batch_fast(sample, add_special_tokens=False)]
    ids, lengths = encoder.encode_flat(sample)
    assert lengths.tolist() == list(map(len, expected)) and ids.tolist() == [i for one in expected for i in one]


def test_other_normalisers_keep_the_tokenizer_itself():
    tokenizer = train_wordpiece(WORDS * 20, vocab_size=100).backend
    tokenizer.normalizer = normalizers.NFKC()
    assert PrenormalizedEncoder.of(tokenizer) is None
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.normalizer = None
    assert PrenormalizedEncoder.of(copy) is None
