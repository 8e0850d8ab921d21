"""Token classification: CoNLL-2003 NER, by fine-tuning (paper §5.3) or from fixed features (Table 7).

Fine-tuning: the shared encoder plus one linear layer over the label set, every parameter trained.
Feature-based (`features=` one of `lightbert.model.feature_based.layer_combinations`): the encoder frozen, its
layers combined and fed to a two-layer BiLSTM; only the BiLSTM, the layer weights and the classifier train.

Either way the loss is the cross-entropy on each word's first sub-token, and validation logs entity-level
precision, recall and F1 (`val/f1`, plus `val/f1_<TYPE>`) over whole sentences, from every device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from lightbert.model import BertForTokenClassification
from lightbert.model.feature_based import FeatureBasedTagger
from lightbert.ner_eval import EntityF1
from lightbert.tasks.base import TaskModule


class TokenClassificationModule(TaskModule):
    """Plain arguments (`save_hyperparameters` keeps plain containers; `load_from_checkpoint` just works)."""

    def __init__(
        self,
        model: dict,
        optim: dict,
        label_names: Sequence[str],
        features: str | None = None,
        lstm_hidden_size: int = 768,
        lstm_layers: int = 2,
    ):
        super().__init__(model, optim)
        self.save_hyperparameters()
        self.label_names = list(label_names)
        if features is None:
            self.model = BertForTokenClassification(self.config, len(self.label_names))
        else:
            self.model = FeatureBasedTagger(self.config, len(self.label_names), features, lstm_hidden_size, lstm_layers)
        self.outside = self.label_names.index("O")
        self.val_f1 = EntityF1(self.label_names)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def word_predictions(self, logits: torch.Tensor, word_starts: torch.Tensor) -> torch.Tensor:
        """(B, W) label of each word, read at its first sub-token; "O" for a word that was cut off."""
        predicted = logits.argmax(-1).gather(1, word_starts.clamp(min=0))
        return predicted.masked_fill(word_starts < 0, self.outside)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        logits = self(batch)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self(batch)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        self.log("val/loss", loss, batch_size=batch["input_ids"].shape[0], sync_dist=True)
        self.val_f1.update(self.word_predictions(logits, batch["word_starts"]), batch["word_labels"])

    def on_validation_epoch_end(self) -> None:
        for name, value in self.val_f1.compute().items():  # compute() sums the counts of every device
            self.log(f"val/{name}", value, prog_bar=name == "f1")
        self.val_f1.reset()

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        return {"idx": batch["idx"], "prediction": self.word_predictions(self(batch), batch["word_starts"])}
