"""Lightning callbacks of every run (conf/train.yaml `callbacks:`)."""

from __future__ import annotations

import time

import lightning as L


class Throughput(L.Callback):
    """Logs `train/tokens_per_s` (real tokens, padding not counted) and `train/examples_per_s` of this device.

    Each step is timed from the end of the previous one, wall clock, so data loading, the optimiser and logging
    count too: what a run really gets, not a kernel's peak. Lightning writes every `trainer.log_every_n_steps`-th.
    Nothing here waits for the GPU: the hot loop gains no synchronisation.
    """

    def __init__(self) -> None:
        self._last: float | None = None

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: dict, batch_idx: int) -> None:
        if self._last is None:  # the first step of the run: from its own start
            self._last = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: object, batch: dict, batch_idx: int
    ) -> None:
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        if mask is None:
            return
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        if seconds > 0:
            # Logged as device tensors: read (one sync) only when Lightning writes the logs, never every step.
            # Without a per-step sync a step's wall time can shift to the next one, but over the steps between two
            # logs the GPU's queue keeps the total honest. An example is the first dimension: (B, T), or (B, C, T).
            module.log("train/tokens_per_s", mask.sum() / seconds, on_step=True, on_epoch=False)
            module.log("train/examples_per_s", mask.shape[0] / seconds, on_step=True, on_epoch=False)

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._last = None  # validation time is not training throughput

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._last = None
