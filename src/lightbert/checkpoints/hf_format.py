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
from tokenizers import Tokenizer, processors

from lightbert.data.tokenizer import SPECIAL_TOKENS, BertTokenizer
from lightbert.errors import UserError
from lightbert.model import BertConfig

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")  # "bert-base-uncased", "google-bert/bert-base-uncased"
# A sentence-transformers model's modules too (modules.json, the pooling's config, the length it cuts texts to)
HUB_PATTERNS = [
    "config.json",
    *HF_WEIGHT_FILES,
    *HF_TOKENIZER_FILES,
    "tokenizer_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "*_Pooling/config.json",
]
_CONFIG_KEYS = {f.name for f in fields(BertConfig)}


def hf_config_to_lightbert(hf_config: dict, where: Path | str = "config.json") -> dict:
    """A Hugging Face BERT config.json as lightbert's BertConfig fields; what lightbert cannot run as transformers
    runs it is refused here, in one line naming the value found and what is supported."""
    model_type = hf_config.get("model_type", "bert")
    if model_type == "modernbert":
        return hf_modernbert_config_to_lightbert(hf_config, where)
    if model_type != "bert":
        raise UserError(
            f"{where} has model_type {model_type!r}; lightbert loads BERT and ModernBERT models only "
            "(model_type 'bert' or 'modernbert')"
        )
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


def hf_state_dict_to_lightbert(
    state: dict[str, torch.Tensor], hf_config: dict | None = None
) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict under lightbert's names; `hf_config` (config.json) says whether it is ModernBERT's."""
    if (hf_config or {}).get("model_type") == "modernbert":
        architecture = (hf_config.get("architectures") or ["ModernBertForMaskedLM"])[0]
        return modernbert_state_dict_to_lightbert(state, architecture)
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


def write_tokenizer_files(tokenizer: BertTokenizer, directory: Path, max_length: int, modern: bool = False) -> None:
    """tokenizer.json, and what transformers' AutoTokenizer reads beside it: BERT's vocab.txt and tokenizer_config;
    for the modern encoder, whose tokenizer need not be WordPiece (ModernBERT's is BPE), tokenizer.json as the fast
    tokenizer with BERT's special-token names. tokenizer.json adds [CLS] and [SEP] itself (`with_special_tokens`)."""
    with_special_tokens(tokenizer).save(directory / "tokenizer.json")
    if modern:
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": max_length,
            "model_input_names": ["input_ids", "attention_mask"],
            **dict(
                zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS, strict=True)
            ),
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        return
    tokenizer.save_vocab_txt(directory / "vocab.txt")
    normalizer = json.loads(tokenizer.backend.to_str()).get("normalizer") or {}
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(normalizer.get("lowercase", True)),
        "model_max_length": max_length,
        **dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS, strict=True)),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def with_special_tokens(tokenizer: BertTokenizer) -> BertTokenizer:
    """`tokenizer` with a post-processor that adds [CLS] and [SEP] (BERT's template), as an exported tokenizer.json
    needs: lightbert adds them in its own code (it encodes without them) and trains its tokenizers without one, while
    transformers' fast tokenizers take tokenizer.json's as it is (`PreTrainedTokenizerFast`, which the modern export
    names, and transformers 4's `BertTokenizerFast`), so `AutoTokenizer`, `pipeline` and `SentenceTransformer` would
    feed the model inputs it never saw. One that adds them already (ModernBERT's) is kept; `tokenizer` is unchanged."""
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    ids = tokenizer.backend.encode("a", add_special_tokens=True).ids
    if ids[:1] == [cls] and ids[-1:] == [sep] and len(ids) > 2:
        return tokenizer
    backend = Tokenizer.from_str(tokenizer.backend.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return BertTokenizer(backend)


def checked_config(values: dict, where: Path) -> dict:
    try:
        return BertConfig.from_dict(values).to_dict()
    except UserError as error:
        raise UserError(f"{where}: {error}") from None


# -- ModernBERT (transformers' `ModernBertForMaskedLM` and its heads) --------------------------------------------------
#
# The modern recipe is a set of options of lightbert's encoder (model/bert.py), which keeps BERT's names; these map them
# onto transformers' ModernBERT, whose Q/K/V are one `Wqkv` projection (its rows: the queries', the keys', the
# values'). A BERT-shaped head maps by the architecture: the MLM head `cls.predictions.transform` is ModernBERT's
# `head`, and so is a classifier's pooler (`bert.pooler`) or a token-level head's `head`.

# The config of lightbert's encoder that is ModernBERT's, field by field (all but the sizes and the window's settings).
MODERNBERT_BLOCKS = {
    "norm_position": "pre",
    "mlp": "geglu",
    "position_embedding_type": "rotary",
    "embedding_norm": True,
    "final_norm": True,
    "pooler": "head",
    "type_vocab_size": 0,
    "attention": "bidirectional",
}
# transformers' ModernBertConfig values lightbert's encoder runs as transformers does, and no other.
_MODERNBERT_FIXED = {
    "hidden_activation": "gelu",
    "classifier_activation": "gelu",
    "decoder_bias": True,
    "tie_word_embeddings": True,
}


def hf_family(config: dict, where: str = "the checkpoint") -> str:
    """Which transformers model a lightbert config is: "bert" or "modernbert"; any other mix of the options (pre-LN
    with a position table, say) is neither, and is refused in one line."""
    values = BertConfig.from_dict(config).to_dict()
    if all(values[k] == v for k, v in MODERNBERT_BLOCKS.items()):
        return "modernbert"
    bert_defaults = {f.name: f.default for f in fields(BertConfig)}
    differ = [
        k
        for k in ("norm_position", "mlp", "position_embedding_type", "embedding_norm", "final_norm", "pooler")
        + ("attention_bias", "mlp_bias", "norm_bias", "head_bias", "global_attn_every_n_layers")
        if values[k] != bert_defaults[k]
    ]
    if not differ:
        return "bert"
    modern_but = [k for k, v in MODERNBERT_BLOCKS.items() if values[k] != v]
    if len(modern_but) < len(differ):  # the modern recipe's blocks with a setting or two of its own: name those
        theirs = ", ".join(f"{k}={MODERNBERT_BLOCKS[k]}" for k in modern_but)
        raise UserError(
            f"{where} is the modern encoder but for {', '.join(f'{k}={values[k]}' for k in modern_but)}; "
            f"transformers' ModernBERT has {theirs} only, so it cannot be exported as one: run it with lightbert "
            "(src/predict.py) or export it with to-onnx"
        )
    raise UserError(
        f"{where} mixes BERT's blocks with the modern recipe's ({', '.join(f'{k}={values[k]}' for k in differ)}), "
        "which neither transformers' BERT nor its ModernBERT runs; run it with lightbert (src/predict.py) or export "
        "it with to-onnx"
    )


def _modernbert_layer_period(hf_config: dict, layers: int, where: Path | str) -> int:
    """global_attn_every_n_layers from transformers' `layer_types` (or an older config's own key)."""
    types = hf_config.get("layer_types")
    if types is None:
        return int(hf_config.get("global_attn_every_n_layers", 3))
    if len(types) != layers or types[0] != "full_attention":
        raise UserError(
            f"{where}: layer_types {types} is not a global layer every N layers from layer 0, the only pattern "
            "lightbert's encoder has (model.global_attn_every_n_layers)"
        )
    globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
    period = globals_[1] if len(globals_) > 1 else layers
    if [("sliding_attention" if i % period else "full_attention") for i in range(layers)] != list(types):
        raise UserError(
            f"{where}: layer_types {types} is not a global layer every N layers from layer 0, the only pattern "
            "lightbert's encoder has (model.global_attn_every_n_layers)"
        )
    return period


def hf_modernbert_config_to_lightbert(hf_config: dict, where: Path | str = "config.json") -> dict:
    """transformers' ModernBertConfig (config.json) as lightbert's BertConfig fields; a setting lightbert's encoder
    does not have is refused in one line naming it."""
    for key, value in _MODERNBERT_FIXED.items():
        if hf_config.get(key, value) != value:
            raise UserError(
                f"{where}: {key} is {hf_config[key]!r}; lightbert's modern encoder runs {key}={value!r} only"
            )
    rope = hf_config.get("rope_parameters") or {}
    thetas = {}
    for kind, old_key, default in (
        ("full_attention", "global_rope_theta", 160000.0),
        ("sliding_attention", "local_rope_theta", 10000.0),
    ):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise UserError(
                f"{where}: rope_parameters.{kind}.rope_type is {params['rope_type']!r}; lightbert's rotary positions "
                "are the default (unscaled) ones"
            )
        thetas[kind] = float(params.get("rope_theta", hf_config.get(old_key, default)))
    if hf_config.get("embedding_dropout", 0.0) != hf_config.get("mlp_dropout", 0.0):
        raise UserError(
            f"{where}: embedding_dropout ({hf_config.get('embedding_dropout')}) and mlp_dropout "
            f"({hf_config.get('mlp_dropout')}) differ; lightbert's encoder has one hidden_dropout_prob for both"
        )
    layers = int(hf_config.get("num_hidden_layers", 22))
    cutoff = hf_config.get("initializer_cutoff_factor", 2.0)
    values = {
        **MODERNBERT_BLOCKS,
        "vocab_size": hf_config.get("vocab_size", 50368),
        "hidden_size": hf_config.get("hidden_size", 768),
        "num_hidden_layers": layers,
        "num_attention_heads": hf_config.get("num_attention_heads", 12),
        "intermediate_size": hf_config.get("intermediate_size", 1152),
        "max_position_embeddings": hf_config.get("max_position_embeddings", 8192),
        "hidden_dropout_prob": float(hf_config.get("mlp_dropout", 0.0)),
        "attention_probs_dropout_prob": float(hf_config.get("attention_dropout", 0.0)),
        "layer_norm_eps": float(hf_config.get("norm_eps", 1e-5)),
        "initializer": "modernbert",  # as transformers draws a ModernBERT's fresh weights (a new head's)
        "initializer_range": float(hf_config.get("initializer_range", 0.02)),
        "initializer_cutoff_factor": 3.0 if cutoff is None else float(cutoff),  # null: transformers cuts at 3
        "pad_token_id": hf_config.get("pad_token_id") or 0,
        "attention_bias": bool(hf_config.get("attention_bias", False)),
        "mlp_bias": bool(hf_config.get("mlp_bias", False)),
        "norm_bias": bool(hf_config.get("norm_bias", False)),
        "head_bias": bool(hf_config.get("classifier_bias", False)),
        "rope_theta": thetas["full_attention"],
        "local_rope_theta": thetas["sliding_attention"],
        "global_attn_every_n_layers": _modernbert_layer_period(hf_config, layers, where),
        "local_attention": int(hf_config.get("local_attention", 128)),
        "classifier_pooling": hf_config.get("classifier_pooling", "cls"),
    }
    return checked_config(values, Path(where))


def lightbert_config_to_modernbert(config: dict, tokenizer: BertTokenizer | None = None) -> dict:
    """lightbert's config of the modern encoder as transformers' ModernBertConfig (config.json), with the special
    tokens' ids of its `tokenizer`."""
    c = BertConfig.from_dict(config)
    specials = {}
    if tokenizer is not None:
        specials = {
            "cls_token_id": tokenizer.cls_id,
            "bos_token_id": tokenizer.cls_id,
            "sep_token_id": tokenizer.sep_id,
            "eos_token_id": tokenizer.sep_id,
        }
    return {
        **specials,
        "architectures": ["ModernBertForMaskedLM"],
        "model_type": "modernbert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_activation": "gelu",
        "classifier_activation": "gelu",
        "norm_eps": c.layer_norm_eps,
        "norm_bias": c.norm_bias,
        "attention_bias": c.attention_bias,
        "mlp_bias": c.mlp_bias,
        "classifier_bias": c.head_bias,
        "decoder_bias": True,
        "embedding_dropout": c.hidden_dropout_prob,
        "mlp_dropout": c.hidden_dropout_prob,
        "attention_dropout": c.attention_probs_dropout_prob,
        "classifier_dropout": c.hidden_dropout_prob,
        "initializer_range": c.initializer_range,
        "initializer_cutoff_factor": c.initializer_cutoff_factor,
        "pad_token_id": c.pad_token_id,
        "local_attention": c.local_attention,
        "layer_types": [
            "full_attention" if c.is_global(i) else "sliding_attention" for i in range(c.num_hidden_layers)
        ],
        "rope_parameters": {
            "full_attention": {"rope_theta": c.rope_theta, "rope_type": "default"},
            "sliding_attention": {"rope_theta": c.local_rope_theta, "rope_type": "default"},
        },
        "classifier_pooling": c.classifier_pooling,
        "tie_word_embeddings": True,
    }


# (transformers' name, lightbert's), in order; `{i}` a layer. Q/K/V are apart here and one Wqkv there.
_MODERNBERT_NAMES = (
    ("model.embeddings.tok_embeddings.", "bert.embeddings.word_embeddings."),
    ("model.embeddings.norm.", "bert.embeddings.LayerNorm."),
    ("model.layers.{i}.attn_norm.", "bert.encoder.layer.{i}.attention_norm."),
    ("model.layers.{i}.attn.Wo.", "bert.encoder.layer.{i}.attention.output.dense."),
    ("model.layers.{i}.mlp_norm.", "bert.encoder.layer.{i}.mlp_norm."),
    ("model.layers.{i}.mlp.Wi.", "bert.encoder.layer.{i}.intermediate.dense."),
    ("model.layers.{i}.mlp.Wo.", "bert.encoder.layer.{i}.output.dense."),
    ("model.final_norm.", "bert.final_norm."),
    ("decoder.bias", "cls.predictions.bias"),
)
_QKV = re.compile(r"model\.layers\.(\d+)\.attn\.Wqkv\.(weight|bias)")
_LAYER = re.compile(r"\.(\d+)\.")


def _head_names(architecture: str) -> tuple[tuple[str, str], ...]:
    """Where a ModernBERT class's `head` (dense -> GELU -> norm) and `classifier` sit in lightbert's model."""
    if architecture == "ModernBertForMaskedLM":
        return (
            ("head.dense.", "cls.predictions.transform.dense."),
            ("head.norm.", "cls.predictions.transform.LayerNorm."),
        )
    if architecture in ("ModernBertForSequenceClassification", "ModernBertForMultipleChoice"):
        return (
            ("head.dense.", "bert.pooler.dense."),
            ("head.norm.", "bert.pooler.LayerNorm."),
            ("classifier.", "classifier."),
        )
    if architecture == "ModernBertForQuestionAnswering":
        return (("head.dense.", "head.dense."), ("head.norm.", "head.LayerNorm."), ("classifier.", "qa_outputs."))
    return (("head.dense.", "head.dense."), ("head.norm.", "head.LayerNorm."), ("classifier.", "classifier."))


def _renamed(key: str, pairs: tuple[tuple[str, str], ...]) -> str | None:
    match = _LAYER.search(key)
    layer = match.group(1) if match else None
    for source, target in pairs:
        source_key = source.replace("{i}", layer) if layer is not None else source
        if "{i}" in source and layer is None:
            continue
        if key.startswith(source_key):
            return target.replace("{i}", layer or "") + key[len(source_key) :]
    return None


def modernbert_state_dict_to_lightbert(
    state: dict[str, torch.Tensor], architecture: str = "ModernBertForMaskedLM"
) -> dict[str, torch.Tensor]:
    """transformers' ModernBERT state dict under lightbert's names (Wqkv split into query, key, value)."""
    pairs = (*_MODERNBERT_NAMES, *_head_names(architecture))
    out = {}
    for key, value in state.items():
        if key == "decoder.weight":
            continue  # tied to the embeddings, which lightbert ties itself
        qkv = _QKV.fullmatch(key)
        if qkv is not None:
            layer, kind = qkv.groups()
            for name, part in zip(("query", "key", "value"), value.chunk(3, dim=0), strict=True):
                out[f"bert.encoder.layer.{layer}.attention.self.{name}.{kind}"] = part.contiguous()
            continue
        renamed = _renamed(key, pairs)
        out[renamed if renamed is not None else key] = value
    return out


def lightbert_state_dict_to_modernbert(
    state: dict[str, torch.Tensor], architecture: str = "ModernBertForMaskedLM"
) -> dict[str, torch.Tensor]:
    """lightbert's state dict of the modern encoder under transformers' ModernBERT names (one Wqkv per layer)."""
    pairs = tuple((target, source) for source, target in (*_MODERNBERT_NAMES, *_head_names(architecture)))
    out, parts = {}, {}
    for key, value in state.items():
        if key == "cls.predictions.decoder.weight":
            continue  # tied: transformers ties decoder.weight to the embeddings on load
        match = re.fullmatch(r"bert\.encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)", key)
        if match is not None:
            layer, name, kind = match.groups()
            parts.setdefault((layer, kind), {})[name] = value
            continue
        renamed = _renamed(key, pairs)
        out[renamed if renamed is not None else key] = value.detach().contiguous().clone()
    for (layer, kind), qkv in parts.items():
        out[f"model.layers.{layer}.attn.Wqkv.{kind}"] = torch.cat([qkv["query"], qkv["key"], qkv["value"]]).detach()
    return out
