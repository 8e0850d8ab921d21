"""Fine-tuning for sentence(-pair) classification and regression: GLUE (paper §4.1).

The shared encoder plus one linear layer on the pooled [CLS] vector; every parameter trains. Cross-entropy
for classes, mean squared error for STS-B's similarity score (one output), as in Hugging Face's `run_glue`.
Validation metrics are the leaderboard's, computed by torchmetrics over the whole split, on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import (
    Accuracy,
    F1Score,
    MatthewsCorrCoef,
    MeanMetric,
    MetricCollection,
    PearsonCorrCoef,
    SpearmanCorrCoef,
)

from lightbert.data.glue import GlueTask, glue_task
from lightbert.model import BertForSequenceClassification
from lightbert.tasks.base import TaskModule


def glue_metrics(spec: GlueTask) -> MetricCollection:
    """The leaderboard's metrics of a task; classification metrics take class indices, regression ones scores."""
    factories = {
        "accuracy": lambda: Accuracy(task="multiclass", num_classes=spec.num_labels),
        "f1": lambda: F1Score(task="binary"),  # of the positive class (1: equivalent / duplicate)
        "mcc": lambda: MatthewsCorrCoef(task="binary"),
        "pearson": PearsonCorrCoef,
        "spearman": SpearmanCorrCoef,
    }
    return MetricCollection({name: factories[name]() for name in spec.metrics})


class SequenceClassificationModule(TaskModule):
    """Plain arguments (`save_hyperparameters` keeps plain containers; `load_from_checkpoint` just works)."""

    def __init__(self, model: dict, optim: dict, task: str):
        super().__init__(model, optim)
        self.save_hyperparameters()
        self.spec = glue_task(task)
        self.model = BertForSequenceClassification(self.config, self.spec.num_labels)
        self.val_metrics = torch.nn.ModuleList(glue_metrics(self.spec) for _ in self.spec.validation_splits)
        self.val_losses = torch.nn.ModuleList(MeanMetric() for _ in self.spec.validation_splits)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.spec.is_regression:
            return F.mse_loss(logits.squeeze(-1).float(), labels.float())
        return F.cross_entropy(logits.float(), labels)

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """Class indices, or the regression score."""
        return logits.squeeze(-1).float() if self.spec.is_regression else logits.argmax(-1)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        logits = self(batch)
        labels = batch["labels"]
        self.val_metrics[dataloader_idx].update(self.predictions(logits), labels)
        self.val_losses[dataloader_idx].update(self.loss(logits, labels), labels.shape[0])

    def on_validation_epoch_end(self) -> None:
        # compute() gathers the states of every device, so each example counts exactly once.
        score = None
        for split, metrics, loss in zip(self.spec.validation_splits, self.val_metrics, self.val_losses, strict=True):
            tag = self.spec.validation_tag(split)
            values = {name: value.float() for name, value in metrics.compute().items()}
            metrics.reset()
            self.log(f"val/loss{'_' + tag if tag else ''}", loss.compute())
            loss.reset()
            for name, value in values.items():
                self.log(f"val/{name}{'_' + tag if tag else ''}", value, prog_bar=True)
            if score is None:  # the task's score: the mean of its metrics on the first (MNLI: matched) set
                score = torch.stack(list(values.values())).mean()
        self.log("val/score", score, prog_bar=False)

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        return {"idx": batch["idx"], "prediction": self.predictions(self(batch))}
