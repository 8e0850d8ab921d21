"""The pre-training LightningModule: masked LM + next sentence prediction on the shared encoder (paper §3.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from lightbert.data.batches import examples_in, is_padding
from lightbert.data.encoding import IGNORE_INDEX
from lightbert.model import BertForPreTraining
from lightbert.tasks.pretraining.objectives import check_objective
from lightbert.tasks.pretraining.packing import PACKED_KEYS, packed_rows
from lightbert.tasks.task_module import TaskModule, fixed_lengths


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Share of the labelled rows (label != IGNORE_INDEX) whose arg-max is the label: a masked sum, not a boolean
    index, so its shape never depends on the data (no graph break under torch.compile). In fp32: integer over
    integer would take the default dtype, which a bf16 model's forward sets to bf16 (`trainer.precision=bf16-true`)."""
    labelled = labels != IGNORE_INDEX
    right = (logits.argmax(-1) == labels) & labelled
    return right.sum(dtype=torch.float32) / labelled.sum().clamp(min=1)


def pretraining_losses(
    mlm_logits: torch.Tensor,
    mlm_labels: torch.Tensor,
    nsp_logits: torch.Tensor | None = None,
    nsp_labels: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The step's losses and accuracies from (N, V) MLM logits and (M, 2) NSP logits; IGNORE_INDEX labels count
    for nothing. The logits are read in fp32, for a stable softmax whatever the model's precision."""
    mlm_logits = mlm_logits.float()
    mlm_loss = F.cross_entropy(mlm_logits, mlm_labels, ignore_index=IGNORE_INDEX)
    out = {
        "loss": mlm_loss,
        "mlm_loss": mlm_loss.detach(),
        "mlm_accuracy": accuracy(mlm_logits, mlm_labels),
        "num_predictions": (mlm_labels != IGNORE_INDEX).sum(),
    }
    if nsp_logits is not None:
        nsp_logits = nsp_logits.float()
        nsp_loss = F.cross_entropy(nsp_logits, nsp_labels, ignore_index=IGNORE_INDEX)
        out["loss"] = mlm_loss + nsp_loss
        out["nsp_loss"] = nsp_loss.detach()
        out["nsp_accuracy"] = accuracy(nsp_logits, nsp_labels)
    return out


class PreTrainingModule(TaskModule):
    """loss = LM cross-entropy (over the predicted positions) + NSP cross-entropy where the objective has NSP.

    `objective` is one of `lightbert.tasks.pretraining.objectives.OBJECTIVES`.
    `ltr` trains a left-to-right encoder: its config's
    attention becomes `left_to_right`, recorded in the checkpoint, so that fine-tuning and exports attend the same
    way; the labels (from the data's collator) are each position's next token. Takes plain dicts so
    `save_hyperparameters` stores plain containers and checkpoints load with `torch.load(weights_only=True)`.
    """

    def __init__(self, model: dict, optim: dict, sparse_mlm_head: bool = True, objective: str = "mlm_nsp"):
        check_objective(objective)
        # In place, before the base records the hyperparameters: the checkpoint's model config says left_to_right.
        model["attention"] = "left_to_right" if objective == "ltr" else model.get("attention", "bidirectional")
        super().__init__(model, optim)
        self.sparse_mlm_head, self.objective = sparse_mlm_head, objective
        self.next_sentence = objective == "mlm_nsp"
        self.model = BertForPreTraining(self.config, next_sentence=self.next_sentence)
        # Validation aggregates besides the loss (the base's): exact over the split and across devices.
        names = ("mlm_loss", "mlm_accuracy", *(("nsp_loss", "nsp_accuracy") if self.next_sentence else ()))
        self.val_sums = torch.nn.ModuleDict({name: MeanMetric() for name in names})
        self.losses = pretraining_losses  # compile_step swaps in the compiled function

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        packed = packed_rows(batch)
        if packed is not None:
            for key in ("input_ids", "token_type_ids", "attention_mask", "masked_positions", *PACKED_KEYS):
                torch._dynamo.maybe_mark_dynamic(batch[key], 0)  # the row count follows the examples' lengths
        elif self.compiled:
            fixed_lengths(batch)  # padded to a few lengths (the longest row's bucket): one fixed-shape graph each
        masked = None
        if self.sparse_mlm_head and "masked_positions" in batch:
            # Fixed shapes: the MLM head at each row's prediction slots (the masking collators'); one graph per step.
            masked = batch["masked_positions"]
        elif self.sparse_mlm_head:  # batches without slots (objective ltr's): a boolean mask, a data-dependent count
            masked = batch["labels"] != IGNORE_INDEX
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], masked, packed)

    def _step(self, batch: dict) -> dict[str, torch.Tensor]:
        mlm_logits, nsp_logits = self(batch)
        labels = batch["labels"]
        if not self.sparse_mlm_head:
            mlm_labels = labels.flatten()
        elif "masked_positions" in batch:
            mlm_labels = labels.gather(1, batch["masked_positions"]).flatten()  # empty slots: IGNORE_INDEX
        else:
            mlm_labels = labels[labels != IGNORE_INDEX]
        mlm_logits = mlm_logits.reshape(-1, mlm_logits.shape[-1])  # (N, V)
        nsp_labels = None
        if nsp_logits is not None:  # (B, 2), or packed (R, K, 2) with IGNORE_INDEX in empty slots
            nsp_logits, nsp_labels = nsp_logits.reshape(-1, 2), batch["next_sentence_label"].flatten()
        for rows in (mlm_logits, mlm_labels, nsp_logits, nsp_labels):
            if rows is not None:  # the number of predictions follows the data: compiled once, not per count
                torch._dynamo.maybe_mark_dynamic(rows, 0)
        return self.losses(mlm_logits, mlm_labels, nsp_logits, nsp_labels)

    def compile_step(self, mode: str | None = None, backend: str = "inductor") -> None:
        """The model, and the losses: Inductor then reads the (N, V) MLM logits in one fused pass for the cast,
        log-softmax, loss and arg-max (and one for their gradient) instead of one pass per eager kernel. Never in
        CUDA graphs (reduce-overhead): a replay overwrites its outputs, and the logged losses of the step before
        would change under the logger."""
        super().compile_step(mode, backend)
        self.losses = torch.compile(pretraining_losses, backend=backend)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self._step(batch)
        batch_size = batch["input_ids"].shape[0]  # rows: logged per step, so only epoch means would weigh them
        for name in ("loss", *self.val_sums):
            self.log(f"train/{name}", out[name], prog_bar=name == "loss", batch_size=batch_size)
        return out["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self._step(batch)
        # packed: read on the host, in validation only. A padding batch (devices kept in step) weighs nothing.
        batch_size = 0 if is_padding(batch) else int(examples_in(batch))
        # MLM numbers are per predicted token, NSP numbers per sequence: weight each accordingly (val/loss is their
        # sum, `on_validation_epoch_end`).
        predictions = out["num_predictions"] * (batch_size > 0)
        weights = {"mlm_loss": predictions, "mlm_accuracy": predictions}
        for name, metric in self.val_sums.items():
            self.log_mean(f"val/{name}", metric, out[name], weights.get(name, batch_size))

    def on_validation_epoch_end(self) -> None:
        """val/loss: the sum of the objectives' split means, each over what it predicts (the MLM loss per masked
        token, NSP's per sequence), as the training loss sums them per batch. A mean of the batches' summed losses
        weighs every batch's tokens by its sequences, and parts from val/mlm_loss alone once a validation spans
        batches of different counts (MLM alone: 2.7690 against 2.7289)."""
        parts = ("mlm_loss", "nsp_loss") if self.next_sentence else ("mlm_loss",)
        self.log_computed("val/loss", sum(self.val_sums[name].compute() for name in parts))
        super().on_validation_epoch_end()
