"""What every task's LightningModule shares: the encoder's config, the optimiser with its schedule, and gradient
clipping that holds for every precision and strategy."""

from __future__ import annotations

import lightning as L
from torch.optim import Optimizer

from lightbert.model import BertConfig
from lightbert.optim import OptimConfig, build_optimizer, clip_gradients


class TaskModule(L.LightningModule):
    """Base of the task modules. Subclasses call `save_hyperparameters()` and build `self.model` (the encoder with
    the task's head); arguments stay plain containers so checkpoints load with `torch.load(weights_only=True)`."""

    def __init__(self, model: dict, optim: dict):
        super().__init__()
        self.config = BertConfig.from_dict(model)
        self.optim_config = OptimConfig(**optim)

    def configure_optimizers(self) -> dict:
        # Only what trains: a frozen encoder's parameters have requires_grad=False and stay out of the optimiser.
        return build_optimizer(self.model, self.optim_config, int(self.trainer.estimated_stepping_batches))

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        # Lightning's own clipping refuses the fused AdamW under every mixed precision (bf16 too, which has no scaler
        # to unscale) and norm clipping under FSDP: `trainer.gradient_clip_val` is applied here instead.
        clip_gradients(self.trainer, optimizer, gradient_clip_val, gradient_clip_algorithm)
