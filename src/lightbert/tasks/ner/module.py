"""Token classification: CoNLL-2003 NER, by fine-tuning (paper §5.3) or from fixed features (Table 7).

Fine-tuning: the shared encoder plus one linear layer over the label set, every parameter trained.
Feature-based (`layer_combination=` one of `lightbert.model.feature_based.layer_combinations`): the encoder frozen, its
layers combined and fed to a two-layer BiLSTM; only the BiLSTM, the layer weights and the classifier train.

Either way the loss is the cross-entropy on each word's first sub-token, and validation logs word accuracy
(`val/word_accuracy`, the score of part-of-speech tags) and, for entity tags (a tag set with "O"), entity-level
precision, recall and F1 (`val/f1`, plus `val/f1_<TYPE>`) over whole sentences, from every device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.tasks.heads import HEADS
from lightbert.tasks.ner.metrics import NO_TAG, EntityF1, WordAccuracy, has_entities
from lightbert.tasks.task_module import TaskModule


class TokenClassificationModule(TaskModule):
    head = "token_classification"

    def __init__(
        self,
        model: dict,
        optim: dict,
        label_names: Sequence[str],
        layer_combination: str | None = None,
        lstm_hidden_size: int = 768,
        lstm_layers: int = 2,
        bilstm: bool = False,
    ):
        super().__init__(model, optim)
        self.label_names = list(label_names)
        arguments = {"label_names": self.label_names, "layer_combination": layer_combination, "bilstm": bilstm}
        arguments |= {"lstm_hidden_size": lstm_hidden_size, "lstm_layers": lstm_layers}
        self.model = HEADS[self.head].network(self.config, arguments)
        # A word cut off is predicted "O" (outside every entity), or no tag at all (wrong) for part-of-speech tags
        self.outside = self.label_names.index("O") if has_entities(self.label_names) else NO_TAG
        self.val_f1 = EntityF1(self.label_names) if has_entities(self.label_names) else None
        self.val_word_accuracy = WordAccuracy()

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)

    def prediction(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """(B, W) label of each word, read at its first sub-token; "O" (or NO_TAG) for a word that was cut off."""
        word_starts = batch["word_starts"]
        predicted = logits.argmax(-1).gather(1, word_starts.clamp(min=0))
        return predicted.masked_fill(word_starts < 0, self.outside)

    def update_metrics(self, logits: torch.Tensor, batch: dict, dataloader_idx: int) -> None:
        predicted = self.prediction(logits, batch)
        self.val_word_accuracy.update(predicted, batch["word_labels"])
        if self.val_f1 is not None:
            self.val_f1.update(predicted, batch["word_labels"])

    def log_metrics(self) -> None:
        shown = "f1" if self.val_f1 is not None else "word_accuracy"
        for metric in (m for m in (self.val_f1, self.val_word_accuracy) if m is not None):
            for name, value in metric.compute().items():  # compute() sums the counts of every device
                self.log_computed(f"val/{name}", value, prog_bar=name == shown)
            metric.reset()
