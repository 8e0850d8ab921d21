"""Hugging Face's BERT format, both ways: config.json and state dict names as lightbert's, and back, and the tokenizer
files a Hugging Face directory holds.

lightbert keeps Hugging Face's parameter names (see model/bert.py), so a state dict maps one-to-one. The only
differences are bookkeeping:
- a Lightning checkpoint prefixes every key with the LightningModule's attribute (`model.`);
- Hugging Face may store `cls.predictions.decoder.weight` (the tied word embeddings) and
  `cls.predictions.decoder.bias` (the same tensor as `cls.predictions.bias`); lightbert ties both itself;
- Google's TF-converted checkpoints name LayerNorm parameters `gamma`/`beta`, and a `BertModel` checkpoint
  has no `bert.` prefix.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

import torch

from lightbert.data.tokenizer import SPECIAL_TOKENS, BertTokenizer
from lightbert.errors import UserError
from lightbert.model import BertConfig

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")  # "bert-base-uncased", "google-bert/bert-base-uncased"
HUB_PATTERNS = ["config.json", *HF_WEIGHT_FILES, *HF_TOKENIZER_FILES, "tokenizer_config.json"]
_CONFIG_KEYS = {f.name for f in fields(BertConfig)}


def hf_config_to_lightbert(hf_config: dict, where: Path | str = "config.json") -> dict:
    """A Hugging Face BERT config.json as lightbert's BertConfig fields; what lightbert cannot run as transformers
    runs it is refused here, in one line naming the value found and what is supported."""
    model_type = hf_config.get("model_type", "bert")
    if model_type != "bert":
        raise UserError(f"{where} has model_type {model_type!r}; lightbert loads BERT models only (model_type 'bert')")
    if hf_config.get("hidden_act", "gelu") != "gelu":
        raise UserError(f"{where}: hidden_act {hf_config['hidden_act']!r} is not supported (lightbert uses gelu)")
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise UserError(
            f"{where}: position_embedding_type {position!r} is not supported; lightbert runs absolute position "
            "embeddings only"
        )
    if hf_config.get("add_cross_attention"):
        raise UserError(
            f"{where}: add_cross_attention is true (the decoder of an encoder-decoder model); lightbert runs BERT "
            "encoders and left-to-right BERT models without cross-attention"
        )
    values = {k: v for k, v in hf_config.items() if k in _CONFIG_KEYS}
    values["pad_token_id"] = values.get("pad_token_id") or 0
    if hf_config.get("is_decoder"):
        # transformers runs a decoder BERT (BertLMHeadModel) left to right; so does lightbert's left_to_right model,
        # whose own export writes is_decoder. Read bidirectionally it would give other outputs without a word.
        if values.get("attention", "left_to_right") != "left_to_right":
            raise UserError(
                f"{where}: is_decoder is true but attention is {values['attention']!r}; a decoder attends "
                "left_to_right: remove one of the two"
            )
        values["attention"] = "left_to_right"
    return checked_config(values, Path(where))


def hf_state_dict_to_lightbert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key.startswith(("embeddings.", "encoder.", "pooler.")):  # a bare BertModel checkpoint
            key = "bert." + key
        if key.endswith("position_ids") or key.startswith("cls.predictions.decoder."):
            continue  # a buffer, and the tied decoder weight/bias (lightbert ties them itself)
        out[key] = value
    return out


def hf_lowercase(path: Path) -> bool:
    """`do_lower_case` from tokenizer_config.json (applies to a bare vocab.txt); BERT's default is True."""
    try:
        return bool(json.loads((path / "tokenizer_config.json").read_text()).get("do_lower_case", True))
    except (OSError, json.JSONDecodeError):
        return True


def lightbert_config_to_hf(config: dict) -> dict:
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        **config,
    }


def lightbert_state_dict_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage: drop the tied decoder weight (transformers re-ties it on load).
    return {k: v.detach().contiguous().clone() for k, v in state.items() if k != "cls.predictions.decoder.weight"}


def write_tokenizer_files(tokenizer: BertTokenizer, directory: Path, max_length: int) -> None:
    tokenizer.save(directory / "tokenizer.json")
    tokenizer.save_vocab_txt(directory / "vocab.txt")
    normalizer = json.loads(tokenizer.backend.to_str()).get("normalizer") or {}
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(normalizer.get("lowercase", True)),
        "model_max_length": max_length,
        **dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS, strict=True)),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def checked_config(values: dict, where: Path) -> dict:
    try:
        return BertConfig.from_dict(values).to_dict()
    except UserError as error:
        raise UserError(f"{where}: {error}") from None
