"""The pre-training LightningModule: masked LM + next sentence prediction on the shared encoder (paper §3.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.model import BertForPreTraining
from lightbert.tasks.base import TaskModule


class PreTrainingModule(TaskModule):
    """loss = MLM cross-entropy (over the masked positions) + NSP cross-entropy, as in the reference.

    Takes plain dicts so `save_hyperparameters` stores plain containers and checkpoints load with
    `torch.load(weights_only=True)`.
    """

    def __init__(self, model: dict, optim: dict, sparse_mlm_head: bool = True):
        super().__init__(model, optim)
        self.sparse_mlm_head = sparse_mlm_head
        self.model = BertForPreTraining(self.config)
        # Validation aggregates besides the loss (the base's): exact over the split and across devices.
        self.val_sums = torch.nn.ModuleDict(
            {name: MeanMetric() for name in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")}
        )

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        masked = batch["labels"] != IGNORE_INDEX if self.sparse_mlm_head else None
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], masked)

    def _step(self, batch: dict) -> dict[str, torch.Tensor]:
        mlm_logits, nsp_logits = self(batch)
        labels = batch["labels"]
        mlm_labels = labels[labels != IGNORE_INDEX] if self.sparse_mlm_head else labels.flatten()
        mlm_logits = mlm_logits.reshape(-1, mlm_logits.shape[-1]).float()  # (N, V); fp32 for a stable softmax
        mlm_loss = F.cross_entropy(mlm_logits, mlm_labels, ignore_index=IGNORE_INDEX)
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["next_sentence_label"])
        predicted = mlm_labels != IGNORE_INDEX
        return {
            "loss": mlm_loss + nsp_loss,
            "mlm_loss": mlm_loss.detach(),
            "nsp_loss": nsp_loss.detach(),
            "mlm_accuracy": (mlm_logits.argmax(-1) == mlm_labels)[predicted].float().mean(),
            "nsp_accuracy": (nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean(),
            "num_predictions": predicted.sum(),
        }

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self._step(batch)
        batch_size = batch["input_ids"].shape[0]
        for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
            self.log(f"train/{name}", out[name], prog_bar=name == "loss", batch_size=batch_size)
        return out["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self._step(batch)
        batch_size = batch["input_ids"].shape[0]
        self.log_mean("val/loss", self.val_losses[0], out["loss"], batch_size)
        # MLM numbers are per predicted token, NSP numbers per sequence: weight each accordingly.
        weights = {"mlm_loss": out["num_predictions"], "mlm_accuracy": out["num_predictions"]}
        for name, metric in self.val_sums.items():
            self.log_mean(f"val/{name}", metric, out[name], weights.get(name, batch_size))
