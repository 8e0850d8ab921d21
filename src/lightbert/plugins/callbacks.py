"""Lightning callbacks of every run (conf/train.yaml `callbacks:`)."""

from __future__ import annotations

import logging
import math
import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

from lightbert.data.batches import examples_in
from lightbert.data.encoding import IGNORE_INDEX
from lightbert.model import BertConfig, BertForPreTraining

log = logging.getLogger(__name__)

# Dense (not 2:4 sparse) bf16 tensor-core peak FLOP/s with fp32 accumulation, from NVIDIA's datasheets: the
# denominator of MFU. Matched in order against `torch.cuda.get_device_name()` ("NVIDIA H100 80GB HBM3",
# "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", ...), so a variant precedes its family.
GPU_PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
)


def gpu_peak_flops(device: torch.device) -> float | None:
    """The GPU's dense bf16 peak, or None (CPU, or a GPU not in the table: no `train/mfu` then)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_BF16 if key in name), None)


def step_flops(config: BertConfig, lengths: torch.Tensor, num_predictions: int | torch.Tensor = 0):
    """Useful FLOPs of a training step (forward + backward) of a fully trained encoder.

    Per real token 6N (N: the Transformer blocks' weights; GeGLU's feed-forward has 3·H·I of them, its (H, 2I) input
    projection and (I, H) output, where GELU's has 2·H·I), plus attention's 12·H per (query, key) pair each layer
    scores: T² pairs in a global layer (T: the sequence's real length), in a sliding-window layer only the pairs within
    its window. Plus the MLM head, 6·(H² + H·V), on the predicted positions only. Padding is not useful work and is
    not counted.
    """
    h, layers = config.hidden_size, config.num_hidden_layers
    mlp_weights = (3 if config.mlp == "geglu" else 2) * h * config.intermediate_size
    n = layers * (4 * h * h + mlp_weights)
    lengths = lengths.double() if lengths.device.type == "cpu" else lengths.float()
    global_layers = sum(config.is_global(layer) for layer in range(layers))
    # A local layer's pairs (i, j) with |i - j| <= window: each token with itself, and both ways each distance d from
    # 1 to min(window, T - 1), which T - d pairs are apart.
    reach = (lengths - 1).clamp(max=config.window)
    local_pairs = lengths + 2 * (reach * lengths - reach * (reach + 1) / 2)
    attention = 12 * h * (global_layers * lengths**2 + (layers - global_layers) * local_pairs)
    per_sequence = lengths * 6 * n + attention
    return per_sequence.sum() + 6 * num_predictions * (h * h + h * config.vocab_size)


def sequence_lengths(batch: dict) -> torch.Tensor:
    """Each sequence's real length, on the batch's device: a row's, or in packed rows (`document_ids`) each
    example's (empty slots 0), since attention's work grows with the example's length, not the row's."""
    mask = batch["attention_mask"]
    documents = batch.get("document_ids")
    if documents is None:
        return mask.reshape(-1, mask.shape[-1]).sum(-1)
    slots = batch["cls_positions"].shape[-1]
    counts = torch.zeros(documents.shape[0], slots + 1, dtype=torch.long, device=documents.device)
    return counts.scatter_add_(1, documents, torch.ones_like(documents))[:, 1:].flatten()


class StepClock(L.Callback):
    """Starts `self._last` at the run's first training batch (timing starts with the run's own first step); the
    subclasses read and restart it."""

    _last: float | None = None

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: dict, batch_idx: int) -> None:
        if self._last is None:
            self._last = time.perf_counter()


class Throughput(StepClock):
    """Logs `train/tokens_per_s` (real tokens, padding not counted) and `train/examples_per_s` of this device, and
    on a GPU `train/mfu`: `step_flops` per second over the GPU's dense bf16 peak (`peak_flops` overrides it).

    Each step is timed from the end of the previous one, wall clock, so data loading, the optimiser and logging
    count too: what a run really gets, not a kernel's peak. Lightning writes every `trainer.log_every_n_steps`-th.
    Nothing here waits for the GPU: the hot loop gains no synchronisation.
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        self._last: float | None = None
        self.peak_flops = peak_flops
        self._config: BertConfig | None = None
        self._mlm = False

    def on_fit_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.peak_flops = self.peak_flops or gpu_peak_flops(module.device)
        config = getattr(module, "config", None)
        model = getattr(module, "model", module)
        # MFU's 6N counts a backward pass through every weight: not so for a frozen encoder (feature-based).
        trains_all = all(p.requires_grad for p in model.parameters())
        self._config = config if isinstance(config, BertConfig) and trains_all else None
        self._mlm = isinstance(model, BertForPreTraining)  # its head's work is counted on predicted positions

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: object, batch: dict, batch_idx: int
    ) -> None:
        mask = batch.get("attention_mask") if isinstance(batch, dict) else None
        if mask is None:
            return
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        # Only on the steps the loggers write (trainer.log_every_n_steps): a log() call costs about a millisecond,
        # which is 1% of a small model's CPU step. The rate is still the step's own. (Lightning's LearningRateMonitor
        # asks the same private flag.)
        if seconds > 0 and trainer._logger_connector.should_update_logs:
            # Logged as device tensors: read (one sync) only when Lightning writes the logs, never every step.
            # Without a per-step sync a step's wall time can shift to the next one, but over the steps between two
            # logs the GPU's queue keeps the total honest. An example is the first dimension: (B, T), or (B, C, T).
            lengths = sequence_lengths(batch)
            module.log("train/tokens_per_s", mask.sum() / seconds, on_step=True, on_epoch=False)
            module.log("train/examples_per_s", examples_in(batch) / seconds, on_step=True, on_epoch=False)
            if self.peak_flops and self._config is not None:
                predicted = (batch["labels"] != IGNORE_INDEX).sum() if self._mlm else 0
                flops = step_flops(self._config, lengths, predicted)
                module.log("train/mfu", flops / seconds / self.peak_flops, on_step=True, on_epoch=False)

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._last = None  # validation time is not training throughput

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._last = None


class ConsoleReport(StepClock):
    """Progress as plain lines through lightbert's logger (the console, once, and train.log): every validation's
    metrics, and when stdout is no terminal (SLURM, nohup; no progress bar to look at) the training loss, throughput
    and learning rate at most every `every_seconds`. Nothing here waits for the GPU between two lines."""

    def __init__(self, every_seconds: float = 30.0) -> None:
        self.every_seconds = every_seconds
        self._lines = False
        self._examples: torch.Tensor | int = 0
        self._tokens: torch.Tensor | int = 0

    def on_fit_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._lines = trainer.global_rank == 0 and not console_is_a_terminal()  # decided once, not every step

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: object, batch: dict, batch_idx: int
    ) -> None:
        if not self._lines or not isinstance(batch, dict) or self._last is None:
            return
        now = time.perf_counter()
        mask = batch.get("attention_mask")
        if mask is not None:  # summed on the device: read once per line, not once per step
            self._examples, self._tokens = self._examples + examples_in(batch), self._tokens + mask.sum()
        step = trainer.global_step
        if now - self._last < self.every_seconds and step != 1 and step != trainer.max_steps:
            return
        seconds, self._last = max(now - self._last, 1e-9), now
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        parts = [f"step {step}/{int(total)}"]
        if isinstance(loss, torch.Tensor):
            parts.append(f"train/loss {float(loss):.4f}")
        # The job's throughput: this process's share times the processes (each takes an equal share of the data).
        share = trainer.world_size / seconds
        parts.append(f"{float(self._examples) * share:.1f} examples/s, {float(self._tokens) * share:.0f} tokens/s")
        if trainer.optimizers:
            parts.append(f"lr {trainer.optimizers[0].param_groups[0]['lr']:.3g}")
        log.info(", ".join(parts))
        self._examples, self._tokens = 0, 0

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.global_rank != 0:
            return
        metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items()) if k.startswith("val/")}
        shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
        log.info(f"validation at step {trainer.global_step}: {shown}")
        # Validation time is not training throughput: the clock and the counts start again.
        self._last, self._examples, self._tokens = time.perf_counter(), 0, 0


# train.log only (the root logger's file handler): what the console leaves out
details = logging.getLogger("lightbert_details.compile")
details.setLevel(logging.INFO)


def compile_counters() -> dict[str, int]:
    """Dynamo's and Inductor's counters so far: graphs compiled, graph breaks, FX graphs found in Inductor's cache
    or compiled (one per forward and per backward graph)."""
    from torch._dynamo.utils import counters

    return {
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "cache_misses": counters["inductor"]["fxgraph_cache_miss"],
    }


class CompileTime(L.Callback):
    """Says on the console how long the first training step took under `speed.compile` (it compiles the step, so
    its time is the compile's, minutes on a GPU, less with the caches of an earlier run), with the graphs it made and
    how many Inductor found in its cache; train.log also gets the first validation's compile and the graph breaks'
    reasons. Added by `run.building.callbacks` when the run compiles."""

    def __init__(self) -> None:
        self._started: dict[str, tuple[float, dict[str, int]]] = {}
        self._done: set[str] = set()

    def _start(self, phase: str) -> None:
        if phase not in self._done and phase not in self._started:
            self._started[phase] = (time.perf_counter(), compile_counters())

    def _end(self, phase: str) -> str | None:
        if phase in self._done or phase not in self._started:
            return None
        self._done.add(phase)
        started, before = self._started.pop(phase)
        seconds, after = time.perf_counter() - started, compile_counters()
        made = {key: after[key] - before[key] for key in after}
        cached = made["cache_hits"] + made["cache_misses"]
        from_cache = f", {made['cache_hits']} of its {cached} Inductor graphs from the cache" if cached else ""
        breaks = f", {made['breaks']} graph break(s)" if made["breaks"] else ""
        return f"{seconds:.1f} s ({made['graphs']} graph(s){breaks}{from_cache})"

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: dict, batch_idx: int) -> None:
        self._start("train")

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: object, batch: dict, batch_idx: int
    ) -> None:
        said = self._end("train")
        if said is not None:
            log.info(f"torch.compile: the first training step, compiling included, took {said}")
            self._details()

    def on_validation_batch_start(
        self, trainer: L.Trainer, module: L.LightningModule, batch: dict, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.sanity_checking:
            self._start("validation")

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        module: L.LightningModule,
        outputs: object,
        batch: dict,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        said = self._end("validation") if not trainer.sanity_checking else None
        if said is not None:
            details.info(f"torch.compile: the first validation step, compiling included, took {said}")

    def _details(self) -> None:
        from torch._dynamo.utils import counters

        for reason, count in sorted(counters["graph_break"].items()):
            details.info(f"torch.compile: graph break ({count}x): {reason}")
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        details.info(f"torch.compile: Inductor's cache {cache}; counters {dict(counters['inductor'])}")


class ShortEpochLogging(L.Callback):
    """An epoch of fewer optimizer steps than `trainer.log_every_n_steps` (a small fine-tuning set) would log no
    training step to metrics.csv at all, and Lightning says so with a path into its package: such a run logs once
    per epoch, at its last step, instead."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        batches = trainer.num_training_batches
        if not isinstance(batches, int):  # an endless stream: float("inf")
            return
        steps = max(1, batches // max(1, trainer.accumulate_grad_batches))
        if steps < trainer.log_every_n_steps:
            trainer.log_every_n_steps = steps
            log.debug(f"{steps} steps per epoch: logging every {steps} (trainer.log_every_n_steps is larger)")


class FineTuningResume(L.Callback):
    """Says, once, what a fine-tuning run resumed within an epoch trains of that epoch. Its loader keeps no position
    (pre-training's `StepSampler` does, and skips to the next batch), so Lightning starts the epoch's pass over the
    data again and stops it after the batches the epoch had left: the first batches of a pass drawn again (one
    device: a shuffle from the restored RNG; DDP: the epoch's own order from its start). Lightning's own warning
    ("your dataloader is not resumable") says neither what nor what to do, and is silenced (`run.console`); a
    resume from the end of an epoch continues exactly."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        batches = trainer.num_training_batches
        if not isinstance(batches, int) or batches <= 0:
            return
        steps = math.ceil(batches / max(1, trainer.accumulate_grad_batches))  # Lightning's steps of an epoch
        done = trainer.global_step % steps
        if not done:
            return
        log.info(
            f"resumed at step {trainer.global_step}, {done} of the {steps} steps of epoch {trainer.current_epoch + 1}: "
            f"fine-tuning data does not resume mid-epoch, so that epoch's last {steps - done} steps take the first "
            "batches of a pass over the training set started again (some of its examples are trained twice in it, "
            "others not at all); the epochs after it are whole"
        )


def console_is_a_terminal() -> bool:
    """Whether a person watches stdout, where lightbert's lines and the progress bar go: a terminal shows the bar;
    anything else (SLURM's output file, nohup, a pipe) gets `ConsoleReport`'s plain lines instead, because a bar
    written to a file is one line per refresh (and tqdm's cursor codes, the stray `[A`)."""
    return sys.stdout.isatty()


class RunProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar with lightbert's three changes. A run that steps decide (pre-training: trainer.max_steps
    with max_epochs -1) shows one bar of optimizer steps for the whole run, and after a resume it starts at the step
    resumed from (Lightning's bar counts an epoch's batches: it read `Epoch 0/-2 6/3` after a resume). No `v_num`:
    the run directory names the run. Shown only in a terminal (`console_is_a_terminal`). tqdm, not Rich, whichever
    is installed, so every machine shows the same bar."""

    def __init__(self) -> None:
        super().__init__()
        if not console_is_a_terminal():
            self.disable()

    @staticmethod
    def _by_steps(trainer: L.Trainer) -> bool:
        return trainer.max_epochs == -1 and trainer.max_steps > 0

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        super().on_train_start(trainer, module)
        if self._by_steps(trainer):
            bar = self.train_progress_bar
            bar.reset(total=trainer.max_steps)
            bar.initial = bar.n = trainer.global_step  # the rate counts this run's steps, not the resumed ones
            bar.set_description("Steps")

    def on_train_epoch_start(self, trainer: L.Trainer, *args) -> None:
        if not self._by_steps(trainer):  # else one bar for the whole run, from on_train_start
            super().on_train_epoch_start(trainer, *args)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if not self._by_steps(trainer):
            return super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        bar, step = self.train_progress_bar, trainer.global_step
        if self._should_update(step, bar.total) and bar.n != step:
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, module))  # refreshes the bar

    def get_metrics(self, trainer: L.Trainer, module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, module)
        metrics.pop("v_num", None)
        return metrics
