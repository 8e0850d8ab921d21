"""The architecture config of a BERT encoder (the config's `model` node), typed and checked once. Light to import (no
torch): a run's settings hold it, and a bad size is refused before torch loads. `lightbert.model` builds the
encoder from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from lightbert.errors import ConfigError

# The fields that shape the weights (besides vocab_size), and the ones that only regularise training.
SIZE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
REGULARISATION_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
# Which tokens a token attends to: every one (BERT), or those to its left only (the paper's LTR ablation, Table 5).
# Set by the pre-training objective (task.objective=ltr), kept in every checkpoint so fine-tuning attends the same way.
ATTENTION = ("bidirectional", "left_to_right")


@dataclass(frozen=True)
class BertConfig:
    """Sizes and regularisation of a BERT encoder; field names follow Hugging Face's `BertConfig`.

    A bad value fails here, at start, naming the field (litgpt's `Config.__post_init__` habit).
    """

    vocab_size: int | None = 30522  # None: the tokenizer's, not known yet (a run's settings: the size files leave it)
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    attention: str = "bidirectional"  # one of ATTENTION

    def __post_init__(self) -> None:
        for name in ("vocab_size", *SIZE_FIELDS):
            value = getattr(self, name)
            if name == "vocab_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_attention_heads "
                f"({self.num_attention_heads}); pick a head count that divides it"
            )
        for name in REGULARISATION_FIELDS:
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {value!r}")
        for name in ("layer_norm_eps", "initializer_range"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)!r}")
        if self.vocab_size is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(
                f"the padding token id ({self.pad_token_id}) must be below the vocabulary size ({self.vocab_size}): "
                "the tokenizer and the model's vocabulary disagree"
            )

        if self.attention not in ATTENTION:
            raise ConfigError(  # not a command-line setting: task.objective decides it, checkpoints carry it
                f"the model config's attention must be one of {list(ATTENTION)}, got {self.attention!r} "
                "(task.objective=ltr makes a left_to_right model)"
            )

    @property
    def causal(self) -> bool:
        return self.attention == "left_to_right"

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: dict) -> BertConfig:
        """Build from a mapping, failing on unknown keys with the list of valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise ConfigError(f"unknown model config key(s) {unknown}; valid keys: {sorted(valid)}")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)
