"""What every task's LightningModule shares: the encoder's config, the optimiser with its schedule, gradient
clipping that holds for every precision and strategy, and one rule for the training and validation loss.

A fine-tuning task supplies `loss(outputs, batch)`, `update_metrics`, `log_metrics` and `prediction`; this class
runs the steps. The validation loss of every task is a `MeanMetric` over the split's examples, gathered from every
device by torchmetrics: exact whatever the batch sizes and the number of devices.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

import lightning as L
import torch
from torch.optim import Optimizer
from torchmetrics import MeanMetric, Metric

from lightbert.data.batches import is_padding
from lightbert.model import BertConfig
from lightbert.model.bert import parameter_layout, to_checkpoint
from lightbert.optim import MasterWeights, OptimConfig, build_optimizer, clip_gradients
from lightbert.plugins.checkpointing import check_before_save
from lightbert.plugins.strategies import FullyShardedStrategy

# The model's inputs, (B, T) or multiple choice's (B, C, T)
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def fixed_lengths(batch: dict, rows_change: bool = False) -> None:
    """Tells torch.compile that a batch's length (its last dimension) is one of a few (the length buckets a compiled
    run's batches are padded to: `data.batches.length_buckets`): one graph with fixed shapes per bucket, never one
    graph whose length is a symbol (Dynamo's choice once a second length is seen). `rows_change`: the rows (first
    dimension) change without a new graph (fine-tuning's last batch of an epoch, evaluation's larger batches)."""
    for key in MODEL_INPUTS:
        tensor = batch.get(key)
        if tensor is None:
            continue
        torch._dynamo.mark_static(tensor, tensor.dim() - 1)
        if rows_change:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)


class TaskModule(L.LightningModule):
    """Base of the task modules. Subclasses build `self.model` (the encoder with the task's head); arguments stay
    plain containers so checkpoints load with `torch.load(weights_only=True)` and `load_from_checkpoint`."""

    # The fine-tuned head it trains, a name in the head registry (tasks.heads), kept in checkpoints; None: pre-training.
    head: ClassVar[str | None] = None

    def __init__(self, model: dict, optim: dict, validation_tags: tuple[str, ...] = ("",)):
        super().__init__()
        # Called here, it records the subclass's arguments too (Lightning reads every __init__ frame of `self`).
        self.save_hyperparameters(ignore=["validation_tags"])
        self.config = BertConfig.from_dict(model)
        # One validation set each ('' for the only one; MNLI's 'm' and 'mm'): logged as val/loss, val/loss_m, ...
        self.validation_tags = validation_tags
        self.val_losses = torch.nn.ModuleList(MeanMetric() for _ in validation_tags)
        self.compiled = False  # compile_step: batches come in a few fixed lengths (`fixed_lengths`)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._trainer is not None:  # every checkpoint, on every process: none holds a NaN or infinite state
            check_before_save(self.trainer, self)
        if self.head is not None:
            checkpoint["head"] = self.head  # what loads it back says which head it is (lightbert.tasks.heads)
        masters = next((o.master_of() for o in self._optimizers() if isinstance(o, MasterWeights)), None)
        if masters:  # a bf16 model (bf16-true): its fp32 master weights, what every other precision saves
            with parameter_layout(self):  # the parameters themselves; in the checkpoint's layout below
                weights = self.state_dict(keep_vars=True)
            fp32 = {name: masters[id(tensor)].detach() for name, tensor in weights.items() if id(tensor) in masters}
            checkpoint["state_dict"].update(to_checkpoint(self, fp32))

    def _optimizers(self) -> list[Optimizer]:
        return list(self.trainer.optimizers) if self._trainer is not None else []

    def forward(self, batch: dict) -> Any:
        if self.compiled:
            fixed_lengths(batch, rows_change=True)
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    # -- what a task supplies --------------------------------------------------------------------------------

    def loss(self, outputs: Any, batch: dict) -> torch.Tensor:
        raise NotImplementedError

    def update_metrics(self, outputs: Any, batch: dict, dataloader_idx: int) -> None:
        """Adds a validation batch to the task's metrics."""

    def log_metrics(self) -> None:
        """Logs (and resets) the task's validation metrics at the end of validation."""

    def prediction(self, outputs: Any, batch: dict) -> torch.Tensor:
        """One row per example: what is written to the prediction files."""
        raise NotImplementedError

    # -- the steps -----------------------------------------------------------------------------------------------

    def metric_name(self, name: str, dataloader_idx: int = 0) -> str:
        tag = self.validation_tags[dataloader_idx]
        return f"val/{name}{'_' + tag if tag else ''}"

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch), batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        outputs = self(batch)  # a padding batch too: under FSDP every device's forward gathers with the others'
        name, metric = self.metric_name("loss", dataloader_idx), self.val_losses[dataloader_idx]
        # Logged with weight 0 from a padding batch: a device whose share is only that still computes (and so
        # gathers) every metric at the end, as the others do.
        weight = 0 if is_padding(batch) else batch["input_ids"].shape[0]
        self.log_mean(name, metric, self.loss(outputs, batch), weight)
        if not is_padding(batch):
            self.update_metrics(outputs, batch, dataloader_idx)

    def log_mean(self, name: str, metric: MeanMetric, value: torch.Tensor, weight: torch.Tensor | int) -> None:
        """Adds `value` (weighted) to `metric`, logged as `name` at the end of validation: Lightning computes it over
        every device, logs it and resets it."""
        metric.update(value, weight)
        self.log(name, metric, on_step=False, on_epoch=True, add_dataloader_idx=False)

    def log_computed(self, name: str, value: torch.Tensor | float, prog_bar: bool = False) -> None:
        """Logs a validation value that is already the whole split's, the same on every device (a torchmetrics
        `compute()`, or a score every device computes from gathered outputs). sync_dist averages equal values, so
        it changes nothing; without it Lightning warns under DDP that the value may differ per device."""
        self.log(name, value, prog_bar=prog_bar, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self.log_metrics()

    def on_validation_start(self) -> None:
        # trainer.precision=bf16-true casts the module with .to(bfloat16), which torchmetrics lets reach its states:
        # the sums over a validation split would then be rounded to bf16 (val/loss 10.5000). They stay fp32.
        for metric in self.modules():
            if isinstance(metric, Metric):  # (its `dtype` may read fp32 while its states are bf16)
                metric.to(torch.float32)  # its floating states only (set_dtype would turn counts into floats)

    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        rows = 0 if is_padding(batch) else len(batch["idx"])  # a padding batch predicts nothing
        return {"idx": batch["idx"][:rows], "prediction": self.prediction(self(batch), batch)[:rows]}

    def compile_step(self, mode: str | None = None, backend: str = "inductor") -> None:
        """torch.compile what a step runs (`speed.compile`): the model, in place, so that parameter names and
        checkpoints stay those of the plain model. Pre-training compiles its losses too."""
        self.model.compile(mode=mode, backend=backend)
        self.compiled = True

    def configure_model(self) -> None:
        # trainer=fsdp shards the model here: Lightning calls this hook once the processes and their device mesh
        # exist, before the optimizer is built on the shards. Other strategies have nothing to do.
        if self._trainer is not None and isinstance(self.trainer.strategy, FullyShardedStrategy):
            self.trainer.strategy.shard(self)

    # -- optimisation ------------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        # Lightning casts the model to bf16 (bf16-true) after this hook and before configure_optimizers: the fp32
        # weights (init_from's, or the initialisation) are kept here, by reference, for the master weights to start
        # from; otherwise they would start from the bf16-rounded ones. The cast gives each parameter new storage.
        if stage == "fit":  # elsewhere no optimiser is built, and the references would keep a copy of the model
            self._fp32_weights = {id(p): p.detach() for p in self.model.parameters() if p.dtype == torch.float32}

    @cached_property
    def optim_config(self) -> OptimConfig:
        """The optimiser's settings as recorded (`optim`), checked when the optimiser is built: a module built to
        predict or convert has none (optim={}); those a checkpoint of an older lightbert lacks are its recipe's."""
        return OptimConfig.recipe(**self.hparams.optim)

    def configure_optimizers(self) -> dict:
        # Only what trains: a frozen encoder's parameters have requires_grad=False and stay out of the optimiser.
        fp32_weights, self._fp32_weights = getattr(self, "_fp32_weights", {}), {}
        return build_optimizer(
            self.model, self.optim_config, int(self.trainer.estimated_stepping_batches), fp32_weights
        )

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        # Lightning's own clipping refuses the fused AdamW under every mixed precision (bf16 too, which has no scaler
        # to unscale) and norm clipping under FSDP: `trainer.gradient_clip_val` is applied here instead.
        clip_gradients(self.trainer, optimizer, gradient_clip_val, gradient_clip_algorithm)
