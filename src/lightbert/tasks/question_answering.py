"""Fine-tuning for extractive question answering: SQuAD v1.1 and v2.0 (paper §4.2, §4.3).

The shared encoder plus one linear layer giving every token a start and an end logit; every parameter trains.
The loss is the mean of the start and end cross-entropies, as in the reference. Unlike the reference, which pads
every window to 384 tokens and lets the softmax run over the padding, padding positions are left out of the
softmax: the loss does not depend on how a batch is padded.

Validation collects each window's logits (from every device), turns them into one answer per question across its
windows (`lightbert.data.squad_answers`) and logs the official scores: `val/exact_match` and `val/f1` for v1.1;
`val/exact`, `val/f1`, the HasAns/NoAns breakdown and the null threshold for v2.0.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lightbert.data.batches import gather_dict
from lightbert.model import BertForQuestionAnswering
from lightbert.tasks.base import TaskModule


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the start and end position cross-entropies over the real (unpadded) tokens."""
    padding = batch["attention_mask"] == 0
    losses = []
    for logits, positions in ((start_logits, batch["start_positions"]), (end_logits, batch["end_positions"])):
        logits = logits.float().masked_fill(padding, torch.finfo(torch.float32).min)
        losses.append(F.cross_entropy(logits, positions))
    return (losses[0] + losses[1]) / 2


class QuestionAnsweringModule(TaskModule):
    """Plain arguments (`save_hyperparameters` keeps plain containers; `load_from_checkpoint` just works)."""

    def __init__(self, model: dict, optim: dict):
        super().__init__(model, optim)
        self.save_hyperparameters()
        self.model = BertForQuestionAnswering(self.config)
        self._val_logits: dict[int, np.ndarray] = {}

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        start_logits, end_logits = self(batch)
        loss = span_loss(start_logits, end_logits, batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def _window_logits(self, batch: dict) -> torch.Tensor:
        start_logits, end_logits = self(batch)
        return torch.stack([start_logits, end_logits], dim=-1).float()  # (B, T, 2)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self._window_logits(batch).cpu().numpy()
        lengths = batch["attention_mask"].sum(-1).tolist()
        for idx, row, length in zip(batch["idx"].tolist(), logits, lengths, strict=True):
            self._val_logits[idx] = row[:length].copy()  # a copy: pickling a view would pickle the whole batch

    def on_validation_epoch_end(self) -> None:
        logits = gather_dict(self._val_logits)  # each device saw a share of the windows
        self._val_logits = {}
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "validation_answers"):
            raise RuntimeError("QuestionAnsweringModule validates with a SquadDataModule: pass it as datamodule=")
        # Every device holds all logits and scores them identically, so the values need no further syncing.
        scores, _, _ = datamodule.validation_answers.score(logits)
        for name, value in scores.items():
            if not name.endswith("total"):
                self.log(f"val/{name}", float(value), prog_bar=name in ("exact_match", "exact", "f1"))

    def predict_step(self, batch: dict, batch_idx: int) -> dict[str, torch.Tensor]:
        return {"idx": batch["idx"], "prediction": self._window_logits(batch)}
