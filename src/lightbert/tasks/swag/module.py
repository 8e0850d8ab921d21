"""Multiple choice: SWAG (paper §4.4).

The shared encoder scores each (context, choice) pair with one linear layer on its pooled [CLS] vector; a softmax
over the choices gives the loss (cross-entropy with the right choice). Every parameter trains. Validation accuracy
is computed by torchmetrics over the whole split, on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Accuracy

from lightbert.tasks.heads import HEADS
from lightbert.tasks.task_module import TaskModule


class MultipleChoiceModule(TaskModule):
    head = "multiple_choice"

    def __init__(self, model: dict, optim: dict, num_choices: int = 4):
        super().__init__(model, optim)
        self.model = HEADS[self.head].network(self.config, {})
        self.val_accuracy = Accuracy(task="multiclass", num_classes=num_choices)

    def loss(self, scores: torch.Tensor, batch: dict) -> torch.Tensor:
        return F.cross_entropy(scores.float(), batch["labels"])  # scores: (B, C)

    def prediction(self, scores: torch.Tensor, batch: dict) -> torch.Tensor:
        return scores.argmax(-1)

    def update_metrics(self, scores: torch.Tensor, batch: dict, dataloader_idx: int) -> None:
        self.val_accuracy.update(self.prediction(scores, batch), batch["labels"])

    def log_metrics(self) -> None:
        self.log_computed("val/accuracy", self.val_accuracy.compute(), prog_bar=True)
        self.val_accuracy.reset()
