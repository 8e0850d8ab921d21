"""The feature-based approach (paper §5.3, Table 7): a frozen BERT's layers feeding a BiLSTM tagger.

The encoder is never trained: it runs in eval mode (no dropout) under `torch.no_grad`, and its parameters have
`requires_grad=False`, so the optimiser never sees them. Its hidden states are combined as one of Table 7's rows
and fed, token by token, to a randomly initialised two-layer bidirectional LSTM (768 units per direction, as in
the paper's "two-layer 768-dimensional BiLSTM"), then one linear layer over the label set. As with fine-tuning,
a word's label is read off its first sub-token.

The weighted sums are ELMo's scalar mix (Peters et al. 2018): softmax-normalised learned weights, one per layer,
times a learned scale, all starting equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lightbert.errors import ConfigError
from lightbert.model.bert import BertModel, initialise, run_packed
from lightbert.model_config import BertConfig


@dataclass(frozen=True)
class LayerCombination:
    """Which hidden states (0 = the embedding output, L = the last layer) and how they are combined."""

    paper_name: str
    layers: tuple[int, ...]  # python indices into the L + 1 hidden states; negative from the end
    combine: str  # "one", "weighted_sum" or "concat"


def layer_combinations(num_layers: int) -> dict[str, LayerCombination]:
    """Table 7's rows, in its order, for an encoder of `num_layers` layers (the paper's "All 12 Layers" is all L)."""
    return {
        "embeddings": LayerCombination("Embeddings", (0,), "one"),
        "second_to_last": LayerCombination("Second-to-Last Hidden", (-2,), "one"),
        "last": LayerCombination("Last Hidden", (-1,), "one"),
        "sum_last_four": LayerCombination("Weighted Sum Last Four Hidden", (-4, -3, -2, -1), "weighted_sum"),
        "concat_last_four": LayerCombination("Concat Last Four Hidden", (-4, -3, -2, -1), "concat"),
        "sum_all": LayerCombination("Weighted Sum All Layers", tuple(range(1, num_layers + 1)), "weighted_sum"),
    }


def layer_combination(name: str, num_layers: int) -> LayerCombination:
    combinations = layer_combinations(num_layers)
    if name not in combinations:
        raise ConfigError(f"task.features={name!r} is not known; valid: {list(combinations)}")
    combination = combinations[name]
    if combination.combine != "one" and num_layers < len(combination.layers):
        raise ConfigError(f"task.features={name} needs {len(combination.layers)} layers; the model has {num_layers}")
    return combination


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(s)_j h_j (ELMo's task-specific layer weighting)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        weights = torch.softmax(self.scalars, dim=0)
        return self.gamma * sum(w * h for w, h in zip(weights, layers, strict=True))


class FeatureBasedTagger(nn.Module):
    """Frozen `bert` -> layer combination -> 2-layer BiLSTM -> `classifier`, per token: (B, T, num_labels)."""

    def __init__(
        self,
        config: BertConfig,
        num_labels: int,
        combination: str = "concat_last_four",
        lstm_hidden_size: int = 768,
        lstm_layers: int = 2,
    ):
        super().__init__()
        self.config = config
        self.combination = layer_combination(combination, config.num_hidden_layers)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.bert.requires_grad_(False).eval()  # and kept in eval mode by train() below
        width = len(self.combination.layers) if self.combination.combine == "concat" else 1
        self.mix = ScalarMix(len(self.combination.layers)) if self.combination.combine == "weighted_sum" else None
        self.lstm = nn.LSTM(
            config.hidden_size * width,
            lstm_hidden_size,
            num_layers=lstm_layers,
            bidirectional=True,
            batch_first=True,
            dropout=config.hidden_dropout_prob if lstm_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(2 * lstm_hidden_size, num_labels)
        initialise(self.classifier, config, classifiers=(self.classifier,))  # first: the draws in their old order
        initialise(self.bert, config)  # replaced by init_from

    def train(self, mode: bool = True) -> FeatureBasedTagger:
        super().train(mode)
        self.bert.eval()  # fixed features: no dropout in the encoder, ever
        return self

    def combined_layers(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The combined hidden states (B, T, H or 4H), computed without a graph through the encoder."""
        if self.bert.training:  # e.g. a loop that set each submodule's mode itself: still no encoder dropout
            self.bert.eval()
        with torch.no_grad():
            _, _, hidden_states = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        chosen = [hidden_states[i] for i in self.combination.layers]
        if self.combination.combine == "concat":
            return torch.cat(chosen, dim=-1)
        if self.mix is not None:
            return self.mix(chosen)
        return chosen[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.dropout(self.combined_layers(input_ids, token_type_ids, attention_mask))
        x = run_packed(self.lstm, x, attention_mask)  # each sentence's real tokens only, not its padding
        return self.classifier(self.dropout(x))  # (B, T, num_labels)
