"""Fine-tuning for extractive question answering: SQuAD v1.1 and v2.0 (paper §4.2, §4.3).

The shared encoder plus one linear layer giving every token a start and an end logit; every parameter trains.
The loss is the mean of the start and end cross-entropies, as in the reference. Unlike the reference, which pads
every window to 384 tokens and lets the softmax run over the padding, padding positions are left out of the
softmax: the loss does not depend on how a batch is padded.

Validation collects each window's logits (from every device), turns them into one answer per question across its
windows (`lightbert.tasks.squad.answers`) and logs the official scores: `val/exact_match` and `val/f1` for v1.1;
`val/exact`, `val/f1`, the HasAns/NoAns breakdown and the null threshold for v2.0.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lightbert.distributed import gather_dict
from lightbert.tasks.heads import HEADS
from lightbert.tasks.task_module import TaskModule


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the start and end position cross-entropies over the real (unpadded) tokens."""
    padding = batch["attention_mask"] == 0
    losses = []
    for logits, positions in ((start_logits, batch["start_positions"]), (end_logits, batch["end_positions"])):
        logits = logits.float().masked_fill(padding, torch.finfo(torch.float32).min)
        losses.append(F.cross_entropy(logits, positions))
    return (losses[0] + losses[1]) / 2


class QuestionAnsweringModule(TaskModule):
    """Validation needs the dev set's examples to turn window logits into answers: the DataModule's `evaluator` (a
    `SquadAnswers`), which it builds once its splits are set up."""

    head = "question_answering"

    def __init__(self, model: dict, optim: dict, bilstm: bool = False):
        super().__init__(model, optim)
        self.model = HEADS[self.head].network(self.config, {"bilstm": bilstm})
        self._val_logits: dict[int, np.ndarray] = {}

    def loss(self, outputs: tuple[torch.Tensor, torch.Tensor], batch: dict) -> torch.Tensor:
        return span_loss(*outputs, batch)

    def prediction(self, outputs: tuple[torch.Tensor, torch.Tensor], batch: dict) -> torch.Tensor:
        return torch.stack(outputs, dim=-1).float()  # (B, T, 2): each window's start and end logits

    def update_metrics(self, outputs: tuple[torch.Tensor, torch.Tensor], batch: dict, dataloader_idx: int) -> None:
        logits = self.prediction(outputs, batch).cpu().numpy()
        lengths = batch["attention_mask"].sum(-1).tolist()
        for idx, row, length in zip(batch["idx"].tolist(), logits, lengths, strict=True):
            self._val_logits[idx] = row[:length].copy()  # a copy: pickling a view would pickle the whole batch

    def log_metrics(self) -> None:
        logits = gather_dict(self._val_logits)  # each device saw a share of the windows
        self._val_logits = {}
        answers = self.trainer.datamodule.evaluator()
        # Every device holds all logits and scores them identically, so the values need no further syncing.
        scores, _, _ = answers.score(logits)
        for name, value in scores.items():
            if not name.endswith("total"):
                self.log_computed(f"val/{name}", float(value), prog_bar=name in ("exact_match", "exact", "f1"))
