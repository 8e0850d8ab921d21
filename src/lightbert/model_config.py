"""The architecture config of a BERT encoder (the config's `model` node), typed and checked once. Light to import (no
torch): a run's settings hold it, and a bad size is refused before torch loads. `lightbert.model` builds the
encoder from it.

The defaults are the paper's BERT. The other fields are the options of the one encoder that make the modern recipe
(ModernBERT, Warner et al. 2024; conf/model/modernbert_*.yaml, docs/modern-encoder.md): pre-LayerNorm, no biases,
GeGLU, rotary positions with one base for global layers and one for local ones, global attention every N layers
and sliding-window attention between, a final norm, a classifier head that pools then runs
dense -> GELU -> LayerNorm, and ModernBERT's weight initialisation (`initializer`). Their names follow Hugging Face's
`ModernBertConfig` where it has one.
"""

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
NORM_POSITIONS = ("post", "pre")  # LayerNorm(x + f(x)) (BERT) or x + f(LayerNorm(x)) (ModernBERT)
MLPS = ("gelu", "geglu")  # GELU(xW1)W2 (BERT), or (GELU(xW) * xV)W2 with W and V one (H, 2I) projection
POSITION_EMBEDDINGS = ("absolute", "rotary")  # a learned table (BERT), or rotary (RoPE) on queries and keys
POOLERS = ("tanh", "head")  # dense + tanh at [CLS] (BERT), or pool (CLASSIFIER_POOLING) then dense -> GELU -> norm
CLASSIFIER_POOLING = ("cls", "mean")  # what the "head" pooler reads: [CLS], or the mean of the real tokens
# How the weights are drawn at the start (lightbert.model.bert.initialise): BERT's N(0, initializer_range) everywhere,
# or ModernBERT's truncated normal with a std per role (the output projections scaled down by depth).
INITIALIZERS = ("bert", "modernbert")
# How the weights are drawn: with init_from, the draw of the new head only (the command line's, where it names them).
INITIALIZER_FIELDS = ("initializer", "initializer_range", "initializer_cutoff_factor")
# The fields that say which recipe's blocks the encoder is built of (none is a size: a checkpoint brings them).
ARCHITECTURE_FIELDS = (
    "norm_position",
    "attention_bias",
    "mlp_bias",
    "norm_bias",
    "head_bias",
    "mlp",
    "position_embedding_type",
    "rope_theta",
    "local_rope_theta",
    "global_attn_every_n_layers",
    "local_attention",
    "embedding_norm",
    "final_norm",
    "pooler",
    "classifier_pooling",
)


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
    # The modern recipe's options (module docstring); the defaults are BERT's.
    norm_position: str = "post"  # one of NORM_POSITIONS
    attention_bias: bool = True  # biases of the Q/K/V and output projections
    mlp_bias: bool = True  # biases of the feed-forward layers
    norm_bias: bool = True  # LayerNorm's bias (its shift)
    head_bias: bool = True  # the bias of the MLM head's and the classifier head's dense layer
    mlp: str = "gelu"  # one of MLPS; GeGLU's projection is (H, 2I): intermediate_size is I, the gated width
    position_embedding_type: str = "absolute"  # one of POSITION_EMBEDDINGS; rotary: max_position_embeddings is the
    # longest context, with no table to learn
    rope_theta: float = 160000.0  # rotary base of the global layers
    local_rope_theta: float = 10000.0  # rotary base of the sliding-window (local) layers
    global_attn_every_n_layers: int = 1  # layers 0, N, 2N, ... attend globally, the others in a window; 1: all global
    local_attention: int = 128  # the sliding window, in tokens: each token sees local_attention // 2 on each side
    embedding_norm: bool = True  # LayerNorm after the embeddings (pre-LN: then layer 0 has no attention norm)
    final_norm: bool = False  # LayerNorm after the last layer (pre-LN encoders)
    pooler: str = "tanh"  # one of POOLERS
    classifier_pooling: str = "cls"  # one of CLASSIFIER_POOLING: what the "head" pooler reads
    initializer: str = "bert"  # one of INITIALIZERS
    initializer_cutoff_factor: float = 2.0  # modernbert: every weight drawn within +-(this x its std)

    def __post_init__(self) -> None:
        for name in ("vocab_size", *SIZE_FIELDS):
            value = getattr(self, name)
            if name == "vocab_size" and value is None:
                continue
            if name == "type_vocab_size" and value == 0:  # no segment embeddings (ModernBERT): [SEP] parts pairs
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
        self._check_options()

    def _check_options(self) -> None:
        for name, valid in (
            ("norm_position", NORM_POSITIONS),
            ("mlp", MLPS),
            ("position_embedding_type", POSITION_EMBEDDINGS),
            ("pooler", POOLERS),
            ("classifier_pooling", CLASSIFIER_POOLING),
            ("initializer", INITIALIZERS),
        ):
            if getattr(self, name) not in valid:
                raise ConfigError(f"model.{name} must be one of {list(valid)}, got {getattr(self, name)!r}")
        for name in ("attention_bias", "mlp_bias", "norm_bias", "head_bias", "embedding_norm", "final_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("rope_theta", "local_rope_theta", "initializer_cutoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive number, got {value!r}")
        for name in ("global_attn_every_n_layers", "local_attention"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        if self.position_embedding_type == "rotary" and self.head_size % 2:
            raise ConfigError(
                f"model.position_embedding_type=rotary rotates pairs of dimensions: the head size "
                f"({self.head_size}) must be even"
            )
        if self.sliding and self.local_attention > self.max_position_embeddings:
            # Said from the context's side: a shorter context is what a user changes, and lowering the window alone
            # would leave sequences longer than the context, refused next.
            window, context = self.local_attention, self.max_position_embeddings
            raise ConfigError(
                f"model.max_position_embeddings ({context}) is shorter than model.local_attention ({window}), the "
                f"window of the sliding layers: raise model.max_position_embeddings to at least {window} and to "
                f"task.max_seq_length (the longest input), or lower model.local_attention to {context} or less"
            )
        if self.norm_position == "post" and (self.final_norm or not self.embedding_norm):
            raise ConfigError(
                "model.final_norm and model.embedding_norm=false are for pre-LayerNorm encoders "
                "(model.norm_position=pre); a post-LN layer ends in its own LayerNorm"
            )

    @property
    def causal(self) -> bool:
        return self.attention == "left_to_right"

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary(self) -> bool:
        return self.position_embedding_type == "rotary"

    @property
    def pre_norm(self) -> bool:
        return self.norm_position == "pre"

    @property
    def sliding(self) -> bool:
        """Whether some layers attend in a sliding window."""
        return self.global_attn_every_n_layers > 1 and self.num_hidden_layers > 1

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends globally; the others attend within `local_attention`."""
        return layer % self.global_attn_every_n_layers == 0

    @property
    def window(self) -> int:
        """How far a local layer's token sees on each side, both ends included: |i - j| <= window."""
        return self.local_attention // 2

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


# A sentence embedding model's poolings of its token vectors (lightbert.model.embedding), by sentence-transformers'
# names where they differ: mean of the real tokens, [CLS]'s vector, each text's last real token ("lasttoken").
POOLINGS = ("mean", "cls", "last")
