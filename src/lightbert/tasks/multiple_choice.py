"""Multiple choice: SWAG (paper §4.4).

The shared encoder scores each (context, choice) pair with one linear layer on its pooled [CLS] vector; a softmax
over the choices gives the loss (cross-entropy with the right choice). Every parameter trains. Validation accuracy
is computed by torchmetrics over the whole split, on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Accuracy, MeanMetric

from lightbert.model import BertForMultipleChoice
from lightbert.tasks.base import TaskModule


class MultipleChoiceModule(TaskModule):
    """Plain arguments (`save_hyperparameters` keeps plain containers; `load_from_checkpoint` just works)."""

    def __init__(self, model: dict, optim: dict, num_choices: int = 4):
        super().__init__(model, optim)
        self.save_hyperparameters()
        self.model = BertForMultipleChoice(self.config)
        self.val_accuracy = Accuracy(task="multiclass", num_classes=num_choices)
        self.val_loss = MeanMetric()

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])  # (B, C)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch).float(), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        scores = self(batch).float()
        self.val_accuracy.update(scores.argmax(-1), batch["labels"])
        self.val_loss.update(F.cross_entropy(scores, batch["labels"]), batch["labels"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self.log("val/accuracy", self.val_accuracy.compute(), prog_bar=True)
        self.log("val/loss", self.val_loss.compute())
        self.val_accuracy.reset()
        self.val_loss.reset()
