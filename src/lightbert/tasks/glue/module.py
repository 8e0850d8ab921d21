"""Fine-tuning for sentence(-pair) classification and regression: GLUE (paper §4.1).

The shared encoder plus one linear layer on the pooled [CLS] vector; every parameter trains. Cross-entropy
for classes, mean squared error for STS-B's similarity score (one output), as in Hugging Face's `run_glue`.
Validation metrics are the leaderboard's, computed by torchmetrics over the whole split, on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightbert.tasks.glue.metrics import glue_metrics
from lightbert.tasks.glue.tasks import glue_task
from lightbert.tasks.heads import HEADS
from lightbert.tasks.task_module import TaskModule


class SequenceClassificationModule(TaskModule):
    head = "sequence_classification"

    def __init__(self, model: dict, optim: dict, task: str, bilstm: bool = False):
        self.spec = glue_task(task)
        super().__init__(model, optim, tuple(self.spec.validation_tag(s) for s in self.spec.validation_splits))
        self.model = HEADS[self.head].network(self.config, {"task": task, "bilstm": bilstm})
        self.val_metrics = torch.nn.ModuleList(glue_metrics(self.spec) for _ in self.spec.validation_splits)

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        if self.spec.is_regression:
            return F.mse_loss(logits.squeeze(-1).float(), batch["labels"].float())
        return F.cross_entropy(logits.float(), batch["labels"])

    def prediction(self, logits: torch.Tensor, batch: dict | None = None) -> torch.Tensor:
        """Class indices, or the regression score."""
        return logits.squeeze(-1).float() if self.spec.is_regression else logits.argmax(-1)

    def update_metrics(self, logits: torch.Tensor, batch: dict, dataloader_idx: int) -> None:
        self.val_metrics[dataloader_idx].update(self.prediction(logits), batch["labels"])

    def log_metrics(self) -> None:
        # compute() gathers the states of every device, so each example counts exactly once.
        score = None
        for dataloader_idx, metrics in enumerate(self.val_metrics):
            values = {name: value.float() for name, value in metrics.compute().items()}
            metrics.reset()
            for name, value in values.items():
                self.log_computed(self.metric_name(name, dataloader_idx), value, prog_bar=True)
            if score is None:  # the task's score: the mean of its metrics on the first (MNLI: matched) set
                score = torch.stack(list(values.values())).mean()
        self.log_computed("val/score", score)
