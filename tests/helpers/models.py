"""Small models for the tests: a tiny config, random batches, a random transformers BERT saved to disk."""

from __future__ import annotations

import random

import torch
import transformers
from omegaconf import OmegaConf

from helpers.glue_files import WORDS
from helpers.runs import REPO
from lightbert.data.tokenizer import train_wordpiece
from lightbert.model import BertConfig

TINY = BertConfig(
    vocab_size=300,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=256,
    max_position_embeddings=64,
)


def random_batch(batch: int = 3, seq_len: int = 20, vocab: int = 300):
    torch.manual_seed(0)
    input_ids = torch.randint(5, vocab, (batch, seq_len))
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq_len // 2 :] = 1
    attention_mask = torch.ones_like(input_ids)
    if batch >= 3:
        attention_mask[1, 13:] = 0
        attention_mask[2, 7:] = 0
    return input_ids, token_type_ids, attention_mask


def write_hf_bert(
    directory, seed: int = 0, bare_encoder: bool = False, num_hidden_layers: int = 2, words: list[str] = WORDS
):
    """A small random transformers BERT saved with save_pretrained, plus a WordPiece vocab.txt learnt from `words`."""
    architecture = "BertModel" if bare_encoder else "BertForPreTraining"
    return write_hf_model(directory, architecture, seed=seed, words=words, num_hidden_layers=num_hidden_layers)


def write_hf_model(
    directory,
    architecture: str = "BertForPreTraining",
    *,
    labels: tuple[str, ...] = (),
    seed: int = 0,
    words: list[str] = WORDS,
    dtype: torch.dtype | None = None,
    safe_serialization: bool = True,
    add_pooling_layer: bool = True,
    **config,
):
    """A small random model of transformers' class `architecture`, as its save_pretrained writes it (its labels in
    id2label; fp16/bf16 weights with `dtype`; pytorch_model.bin instead of safetensors), with a WordPiece vocab.txt
    learnt from `words`. `config` sets transformers' BertConfig entries (vocab_size, is_decoder, ...)."""
    rng = random.Random(seed)
    tokenizer = train_wordpiece([" ".join(rng.choice(words) for _ in range(10)) for _ in range(200)], vocab_size=200)
    torch.manual_seed(seed)
    sizes = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }
    if labels:
        config["id2label"] = dict(enumerate(labels))
        config["label2id"] = {name: i for i, name in enumerate(labels)}
    hf_config = transformers.BertConfig(**{**sizes, **config})
    cls = getattr(transformers, architecture)
    model = cls(hf_config, add_pooling_layer=False) if not add_pooling_layer else cls(hf_config)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(directory)
    if not safe_serialization:  # transformers 5 writes safetensors only: the older format, as older versions wrote it
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    tokenizer.save_vocab_txt(directory / "vocab.txt")
    return directory


def extract_config(bert_dir, directory, layers) -> OmegaConf:
    """conf/extract_features.yaml for `in.txt` (one line) in `directory`, written to `out.jsonl` there."""
    (directory / "in.txt").write_text("the city\n")
    cfg = OmegaConf.load(REPO / "conf" / "extract_features.yaml")
    cfg.pop("defaults")
    cfg.pop("hydra")
    cfg.init_from, cfg.input_file, cfg.output_file = (
        str(bert_dir),
        str(directory / "in.txt"),
        str(directory / "out.jsonl"),
    )
    cfg.layers = layers
    return cfg


MODERN_SPECIALS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")  # ModernBERT's names, in its BPE's own order


def train_bpe(words: list[str] = WORDS, seed: int = 0, vocab_size: int = 200):
    """A small byte-level BPE tokenizer with BERT's special-token names, as ModernBERT's tokenizer.json is (its [CLS]
    not id 0, no ## pieces, no lowercasing)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    rng = random.Random(seed)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(MODERN_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(200)]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tokenizer


def write_hf_modernbert(
    directory, architecture: str = "ModernBertForMaskedLM", *, seed: int = 0, words: list[str] = WORDS, **config
):
    """A small random transformers ModernBERT of class `architecture` as save_pretrained writes it, with a BPE
    tokenizer.json (`train_bpe`, learnt from `words`); global attention every third layer and a window of 8 tokens, so
    that sequences of 20 tokens meet it. `config` sets ModernBertConfig entries. The weights are moved off their
    initial values (LayerNorm weights 1, zero biases), so that a weight read into the wrong place shows."""
    tokenizer = train_bpe(words, seed=seed)
    torch.manual_seed(seed)
    ids = {name: tokenizer.token_to_id(name) for name in MODERN_SPECIALS}
    values = {
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 48,
        "max_position_embeddings": 128,
        "local_attention": 8,
        "pad_token_id": ids["[PAD]"],
        "cls_token_id": ids["[CLS]"],
        "bos_token_id": ids["[CLS]"],
        "sep_token_id": ids["[SEP]"],
        "eos_token_id": ids["[SEP]"],
        **config,
    }
    model = getattr(transformers, architecture)(transformers.ModernBertConfig(**values))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory
