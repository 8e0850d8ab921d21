"""What makes a killed run resumable bit for bit: atomic checkpoint files, RNG states, a checkpoint on SIGTERM.

Lightning's checkpoints hold the weights, optimizer, schedule, loop counters and callback states. The data
position needs nothing more: `StepSampler` restarts from the global step. What is missing is the RNG, which
draws dropout: `ResumableRNG` saves every device's generators as they were right after the last optimizer step,
and sets them back right before the first step after a resume, when the DataLoader has started and would
not draw from them any more. `LatestCheckpoint` writes the latest checkpoint at the end and when the process is told to
stop (SIGTERM, which SLURM sends before a preemption or at the time limit), and stops a run whose loss or weights are
no longer finite before any checkpoint holds them (Lightning trains on through NaN by itself).
"""

from __future__ import annotations

import logging
import os
import random
import signal
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightbert.cluster import processes
from lightbert.distributed import is_distributed
from lightbert.errors import UserError
from lightbert.files import replace_atomically

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint next to its destination, then renames it into place.

    A crash during the write leaves the previous file whole (rename is atomic on POSIX file systems).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        path = Path(path)
        try:
            with processes.writing_checkpoint():  # a process of the job dying meanwhile does not cut it short
                replace_atomically(path, lambda tmp: super(AtomicCheckpointIO, self).save_checkpoint(checkpoint, tmp))
        except (OSError, RuntimeError) as error:  # torch reports a failed write as a RuntimeError around the OSError
            cause = error if isinstance(error, OSError) else error.__cause__ or error.__context__ or error
            kept = f"the previous {path.name} is kept whole" if path.exists() else f"no {path.name} was written"
            raise UserError(
                f"could not write the checkpoint {path} ({cause}): is the disk full, or the directory not writable? "
                f"{kept}, and the temporary file was removed. Make room and rerun the command with resume=true"
            ) from None


def rng_states() -> dict[str, Any]:
    """This process's generators, as plain containers and tensors (loadable with weights_only=True)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), position, has_gauss, cached],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


class ResumableRNG(L.Callback):
    """Saves each device's RNG states as of the last optimizer step; restores them before the next step."""

    def __init__(self) -> None:
        self._at_last_step: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None
        self._step_seen = -1

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._pending is not None:
            set_rng_states(self._pending)
            self._pending = None
        if self._step_seen != trainer.global_step:  # a step begins: what a checkpoint of the last one restores
            self._at_last_step, self._step_seen = rng_states(), trainer.global_step

    def on_save_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Saved after the step that the checkpoint holds: the states the next step will start from.
        states = rng_states() if trainer.global_step != self._step_seen else self._at_last_step
        per_rank = [states]
        if is_distributed():  # the file is written by rank 0 alone: it needs every rank's states
            per_rank = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(per_rank, states)
        checkpoint["rng_states"] = per_rank
        checkpoint["job_shape"] = job_shape(trainer)

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        shape = checkpoint.get("job_shape") or {}
        if shape.get("accumulate") and shape["accumulate"] != trainer.accumulate_grad_batches:
            rescale_batch_progress(checkpoint, trainer.accumulate_grad_batches / shape["accumulate"])
        per_rank = checkpoint.get("rng_states")
        if per_rank and len(per_rank) == trainer.world_size:
            self._pending = per_rank[trainer.global_rank]
        elif per_rank:
            # Another number of devices: no state belongs to this rank. Seeded from (seed, step, rank), so that the
            # same resize resumes the same way twice.
            seed = int(os.environ.get("PL_GLOBAL_SEED", "0"))
            derived = (seed * 1_000_003 + int(checkpoint.get("global_step", 0)) * 1_009 + trainer.global_rank) % 2**32
            random.seed(derived)
            np.random.seed(derived)
            torch.manual_seed(derived)
            self._pending = rng_states()
            if trainer.global_rank == 0:
                log.warning(
                    f"the checkpoint holds the RNG states of {len(per_rank)} device(s), this job has "
                    f"{trainer.world_size}: each device's generators are seeded from (seed, step, rank) instead"
                )


def rescale_batch_progress(checkpoint: dict[str, Any], factor: float) -> None:
    """Lightning counts the epoch's batches done in this process's micro-batches; a job that accumulates another
    number per step (a resize that keeps the global batch) has done `factor` times as many of its own. Left as they
    were, Lightning would end the epoch early and the data would move on an epoch too soon. Changed in the loaded
    checkpoint before Lightning restores its loops from it (callbacks load first)."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
    if not progress:
        return
    for part in ("total", "current"):
        counts = progress.get(part, {})
        if "processed" not in counts:
            continue
        # Scaled at `processed`; the others keep their offsets from it, by which Lightning tells where the checkpoint
        # was saved (completed == processed - 1: at a batch's end, whose completion it then counts).
        processed = counts["processed"]
        for key, value in counts.items():
            counts[key] = round(processed * factor) - (processed - value)


class EpochsFromPhaseStart(L.Callback):
    """A recipe's later phase (`run.phases`) starts its data's first epoch at its first step, as a run starts at
    step 0. Its DataModule's position is the steps since then (`PretrainDataModule._position`: epoch and batch of its
    `StepSampler`), and Lightning ends an epoch by its own count of the epoch's batches, which the checkpoint the
    phase starts from carries over from the phase before (stopped at its max_steps mid-epoch). Left so, the phase's
    first epoch ended after (batches per epoch - the count) batches, or after one: the rest of that epoch went
    untrained, and a run resumed within the phase, whose sampler counts from the phase's start, trained other data.
    The count is set back to 0 in the loaded checkpoint before Lightning restores its loops from it (callbacks load
    first); a checkpoint saved later in the phase counts from its start already."""

    def __init__(self, first_step: int) -> None:
        self.first_step = first_step

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if checkpoint.get("global_step") == self.first_step:
            restart_epoch_count(checkpoint)


def restart_epoch_count(checkpoint: dict[str, Any]) -> None:
    """The loaded checkpoint's count of the current epoch's batches, set to 0: the next batch is an epoch's first.
    Set at `processed`; the others keep their offsets from it, by which Lightning tells where the checkpoint was saved
    (`rescale_batch_progress`)."""
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
    counts = (progress or {}).get("current", {})
    if "processed" not in counts:
        return
    processed = counts["processed"]
    for key, value in counts.items():
        counts[key] = value - processed
    progress["is_last_batch"] = False  # no batch of the phase's data has been read: none was an epoch's last


def as_saved_at_the_last_batch_end(checkpoint: dict[str, Any]) -> None:
    """A checkpoint saved at a batch's start (a stop by a signal, `LatestCheckpoint`), given in place the loop counters
    a checkpoint saved at the end of the batch before it holds, with which Lightning resumes where it stopped.

    At a batch's start Lightning has fetched the batch and counted it `ready` (not `started`), and has counted the
    step before it done (`completed`, and `_batches_that_stepped`, the step number the loggers write). From a
    checkpoint saved at a batch's end (`completed == processed - 1`) Lightning counts that batch's completion and its
    step when it resumes; from this one it counted the step again (`_batches_that_stepped` one ahead: every row logged
    at a number one higher, and a row number skipped) and kept the fetched batch in its total (`ready`: validation at
    val_check_interval came a step early). Each signal stop added one more. Set back by one, the counters are those of
    the batch before's end; at an epoch's first batch, those of a batch's end that leaves the new epoch with none done
    (its validation was made before the stop: Lightning skips it on resume, as from any checkpoint of that step).
    Anything else (`ready == started`: saved at a batch's end, at a validation's, at the end) is left as it is, and so
    is a checkpoint already set back."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = loop.get("epoch_loop.batch_progress") or {}
    total = progress.get("total", {})
    if "ready" not in total or total["ready"] != total.get("started", total["ready"]) + 1:
        return
    for part in ("total", "current"):
        counts = progress.get(part, {})
        for key in ("ready", "completed"):
            if key in counts:
                counts[key] -= 1
    # Of the epoch the counters are in, the last batch counted had one after it, or none is counted (its first batch)
    progress["is_last_batch"] = False
    state = loop.get("epoch_loop.state_dict", {})
    if "_batches_that_stepped" in state:
        state["_batches_that_stepped"] -= 1


class CheckpointsWhereTheRunIs(L.Callback):
    """A resumed run reads its `ModelCheckpoint`s' state from last.ckpt: the best checkpoint kept so far, its score,
    the k best, each by absolute path. In a run directory moved or copied since (scratch to another disk, a renamed
    sweep) those are the old directory's paths: Lightning then forgets the best score (its dirpath changed) but keeps
    the old best path, so the next validation replaces a better checkpoint, and the test predictions are read from
    the old directory, or fail where it is gone. Each state is put where the run now is before Lightning loads it."""

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("callbacks") or {}
        for callback in trainer.checkpoint_callbacks:
            state = states.get(callback.state_key) if isinstance(callback, ModelCheckpoint) else None
            if state and callback.dirpath is not None:
                moved_checkpoint_state(state, str(callback.dirpath))


def moved_checkpoint_state(state: dict[str, Any], dirpath: str) -> None:
    """A `ModelCheckpoint` state's paths under its recorded dirpath, put under `dirpath` (in place) where the files
    are there: the directory moved. Otherwise (a dirpath set anew on resume) the state is left to Lightning, which
    keeps the best path and forgets the rest."""
    recorded = state.get("dirpath")
    if not recorded or recorded == dirpath:
        return

    def moved(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path
        try:
            return str(Path(dirpath) / Path(path).relative_to(recorded))
        except ValueError:
            return path

    paths = {key: moved(state[key]) for key in ("best_model_path", "kth_best_model_path", "last_model_path")
             if key in state}  # fmt: skip
    best_k = {moved(path): score for path, score in (state.get("best_k_models") or {}).items()}
    if not all(Path(path).is_file() for path in [*paths.values(), *best_k] if path):
        return
    state.update(paths, dirpath=dirpath)
    if "best_k_models" in state:
        state["best_k_models"] = best_k


def job_shape(trainer: L.Trainer) -> dict[str, int | None]:
    """How the job that saves a checkpoint makes a step: what a resume on another number of devices must keep."""
    per_device = getattr(trainer.datamodule, "batch_size", None)
    accumulate = int(trainer.accumulate_grad_batches)
    global_batch = per_device * trainer.world_size * accumulate if isinstance(per_device, int) else None
    return {"world_size": trainer.world_size, "batch_size": per_device, "accumulate": accumulate,
            "global_batch": global_batch}  # fmt: skip


def saved_job_shape(path: Path) -> dict | None:
    """The job shape a checkpoint recorded (None for one saved before lightbert recorded it), read with mmap."""
    try:
        return torch.load(path, mmap=True, weights_only=True).get("job_shape")
    except Exception:
        return None  # checkpoint_step has already judged the file


def submitit_signal() -> signal.Signals | None:
    """The signal SLURM sends a submitit job before its time limit or a preemption; None outside SLURM jobs."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def slurm_requeue_signal(trainer: L.Trainer) -> signal.Signals | None:
    """The signal after which this job requeues itself: Lightning's SLURM environment with `auto_requeue` (its
    default when a job runs under srun; cluster=slurm turns it off, as submitit requeues), USR1 unless set."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
        return environment.requeue_signal or signal.SIGUSR1
    return None


# The signal that stopped this process's training, for the entry point's message and exit code.
stopped_by: signal.Signals = signal.SIGTERM


class NotFiniteError(UserError):
    """The training loss or the weights became NaN or infinite: the run stops (`LatestCheckpoint`), with no
    checkpoint of that state, and ends as a refused command does (one line, exit 2; a sweep goes on to its next job)."""


NEVER = 1 << 62  # no step and no signal: what a process that has none gives the agreement's MIN all-reduce


class LatestCheckpoint(L.Callback):
    """Writes the latest checkpoint (the `ModelCheckpoint` without a monitor) when training ends, and when the
    job is told to stop: SIGTERM (what SLURM sends before a preemption or at the time limit), Ctrl-C, submitit's
    signal (USR2, cluster=slurm) and Lightning's SLURM requeue signal (USR1 under srun).

    A handler only notes the signal: a collective inside a handler deadlocks when the signal lands while the process
    is in another collective (Lightning's own SIGTERM handler broadcasts, its USR1 handler saves with a barrier).
    Before every optimizer step the processes agree, in one all-reduce that each reaches at the same point, whether
    any of them was signalled; if so every one stops there, after the step it was running, `last.ckpt` is written,
    and the job exits (128 + the signal) or requeues itself: submitit's handler (cluster=slurm), or
    `scontrol requeue` for the USR1 of a job under srun, which then resumes by itself in the same run directory
    (`run_dir.requeued`).

    A process started with SIGINT ignored (a shell's background job) keeps ignoring it.

    A NaN or infinite loss stops the run too, by `NotFiniteError` (one line naming the step and the loss, exit 2): the
    loss of every batch is noted on its device, and read where the host waits anyway (at the logged steps, in the
    agreement under DDP, and before every checkpoint, which also checks the weights). Nothing is saved then: the
    newest checkpoint, written before, is the last finite state.

    A signal's checkpoint is saved at the start of the batch after the last step; it holds the loop counters of that
    step's end (`as_saved_at_the_last_batch_end`), so that the resumed run validates, logs and ends at the steps an
    unbroken run does. A last.ckpt saved at a batch's start by an earlier lightbert is set back when it is loaded.
    """

    def __init__(self) -> None:
        self._received: signal.Signals | None = None
        self._handlers: dict[signal.Signals, Any] = {}  # the handlers these replaced, put back after training
        self._requeue: signal.Signals | None = None
        self._step = 0  # the optimizer step the current batch belongs to
        # On the loss's device, written every batch and read only where the host waits anyway (`_note_loss`): the
        # first step whose loss was not finite (0: none yet), and that loss.
        self._bad_step: torch.Tensor | None = None
        self._bad_loss: torch.Tensor | None = None

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        processes.training_started()
        self._received = None
        self._bad_step = self._bad_loss = None
        self._requeue = submitit_signal() or slurm_requeue_signal(trainer)
        stops = [signal.SIGTERM, signal.SIGINT] + ([self._requeue] if self._requeue is not None else [])
        for signum in stops:
            if signum in self._handlers or signal.getsignal(signum) is signal.SIG_IGN:
                continue
            self._handlers[signum] = signal.getsignal(signum)  # Lightning's, for SIGTERM and USR1
            signal.signal(signum, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        if self._received is None:  # the first signal names the stop; a second one changes nothing
            self._received = signal.Signals(signum)

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._step = trainer.global_step + 1
        if batch_idx % trainer.accumulate_grad_batches:
            return  # within an optimizer step: the stop waits for the step's end (every process is at the same batch)
        received, not_finite = self._agreed(trainer)
        if not_finite:
            raise self._not_finite(trainer, not_finite)
        if received is not None:
            global stopped_by
            self._received = stopped_by = received
            raise SIGTERMException  # Lightning's stop: on_exception below saves, on every process at this batch

    def _agreed(self, trainer: L.Trainer) -> tuple[signal.Signals | None, int]:
        """The signal any process received (the lowest number, where two differ), or None; and under DDP the first
        step whose loss was not finite on any process (0: none), read in the same all-reduce, which waits for the
        devices anyway. One process reads its loss's flag at the logged steps instead (`on_train_batch_end`)."""
        mine = int(self._received or 0)
        if is_distributed() and trainer.world_size > 1:
            flag = torch.tensor([mine or NEVER, NEVER], device=trainer.strategy.root_device)
            if self._bad_step is not None:
                flag[1] = torch.where(self._bad_step > 0, self._bad_step, NEVER)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
            received, bad = flag.tolist()
            return (signal.Signals(received) if received != NEVER else None), (bad if bad != NEVER else 0)
        return (signal.Signals(mine) if mine else None), 0

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._note_loss(loss.detach())
        # Read at the steps Lightning logs, where it reads the logged values from the device too: no wait of its own.
        # Here, before a checkpoint of this step is saved or a validation runs (checkpoint callbacks run last).
        if self._bad_step is not None and not is_distributed() and trainer._logger_connector.should_update_logs:
            bad = int(self._bad_step)
            if bad:
                raise self._not_finite(trainer, bad)

    def _note_loss(self, loss: torch.Tensor) -> None:
        """Notes, on the loss's device and without waiting for it, the first step whose loss is NaN or infinite."""
        if self._bad_step is None:
            self._bad_step = torch.zeros((), dtype=torch.long, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=torch.float32, device=loss.device)
        first = (self._bad_step == 0) & ~torch.isfinite(loss).all()
        self._bad_step = torch.where(first, self._step, self._bad_step)
        self._bad_loss = torch.where(first, loss.float().mean(), self._bad_loss)

    def _not_finite(self, trainer: L.Trainer, step: int, what: str | None = None) -> NotFiniteError:
        """The stop's one line: what was not finite at which step, and the checkpoint to go on from (saved before,
        when the state was finite: no checkpoint is written after it, `check_before_save`)."""
        if what is None:
            mine = self._bad_step is not None and int(self._bad_step) == step
            what = f"the training loss is {float(self._bad_loss)}" if mine else "the training loss is not finite"
        return NotFiniteError(f"{what} at step {step}: the run stopped there; {self._last_finite(trainer)}")

    def _last_finite(self, trainer: L.Trainer) -> str:
        """Which checkpoint to go on from: the newest, saved before the stop, holds the last finite state. A resume
        retraces the same steps (the settings are recorded, the data order and the RNG resume exactly)."""
        latest = self._latest_path(trainer)
        try:
            step = int(torch.load(latest, mmap=True, weights_only=True)["global_step"]) if latest else None
        except Exception:
            step = None
        if step is None:
            return "no checkpoint was saved before it: run again with a lower optim.lr or optim.weight_decay"
        return (
            f"the last finite state is {latest} (step {step}): resume=true (hydra.run.dir={latest.parent.parent}) "
            f"retraces the same steps with the same settings; to change them, start a new run from it with "
            f"init_from={latest} and e.g. a lower optim.lr"
        )

    def check_before_save(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """Before any checkpoint is written (the best, last.ckpt, a signal's: `TaskModule.on_save_checkpoint`, on
        every process): a loss that was not finite since the last read, or weights that are not, stop the run, so
        that the newest checkpoint kept is a finite state. A save waits for the device anyway: the read, the weights'
        check and one all-reduce cost little beside the write."""
        from torch.distributed.tensor import DTensor

        # FSDP: this process's shard (the others check theirs; the all-reduce joins them)
        weights = [p.to_local() if isinstance(p, DTensor) else p for p in module.parameters()]
        device = trainer.strategy.root_device
        finite = torch.stack([torch.isfinite(w).all() for w in weights]).all() if weights else torch.tensor(True)
        bad = self._bad_step if self._bad_step is not None else torch.zeros((), dtype=torch.long)
        flag = torch.stack([torch.where(bad > 0, bad, NEVER).to(device), finite.long().to(device)])
        if is_distributed() and trainer.world_size > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        bad_step, all_finite = flag.tolist()
        if bad_step != NEVER:
            raise self._not_finite(trainer, bad_step)
        if not all_finite:
            raise self._not_finite(trainer, trainer.global_step, "the weights are not finite (NaN or inf)")

    def teardown(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        processes.training_ended()
        for signum, handler in self._handlers.items():  # Ctrl-C outside training (predictions) is Python's again
            signal.signal(signum, handler)
        self._handlers = {}

    @staticmethod
    def _latest_path(trainer: L.Trainer) -> Path | None:
        """Where the `ModelCheckpoint` without a monitor writes the latest checkpoint (last.ckpt), if there is one."""
        checkpoints = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        latest = next((c for c in checkpoints if not c.monitor), None)
        if latest is None or latest.dirpath is None:
            return None
        return Path(latest.dirpath) / f"{latest.filename or 'last'}{latest.FILE_EXTENSION}"

    def _save(self, trainer: L.Trainer, why: str) -> None:
        path = self._latest_path(trainer)
        if path is None:
            return
        trainer.save_checkpoint(path, weights_only=False)  # the whole state: what resume=true continues from
        if why:
            log.warning(
                f"{why}: saved {path} at step {trainer.global_step}; to continue, rerun the command with "
                f"hydra.run.dir={path.parent.parent} resume=true"
            )

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._save(trainer, "")

    def on_save_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        as_saved_at_the_last_batch_end(checkpoint)  # a signal's, saved at a batch's start; any other is left as it is

    def on_load_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        as_saved_at_the_last_batch_end(checkpoint)  # one saved before lightbert set the counters back when saving

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        received = self._received or signal.SIGTERM
        self._save(trainer, received.name)
        if received != self._requeue:
            return
        handler = self._handlers.get(received)
        if submitit_signal() is not None and callable(handler):
            handler(received, None)  # submitit's: requeues this job (its first task) and exits
        elif trainer.is_global_zero:
            requeue_slurm_job()


def check_before_save(trainer: L.Trainer, module: L.LightningModule) -> None:
    """`LatestCheckpoint.check_before_save` of the run's `LatestCheckpoint`; without one, only the weights."""
    stops = next((c for c in trainer.callbacks if isinstance(c, LatestCheckpoint)), None)
    (stops or LatestCheckpoint()).check_before_save(trainer, module)


def requeue_slurm_job() -> None:
    """`scontrol requeue` this SLURM job (an array job's own task): SLURM starts it again with the same job id, which
    resumes from last.ckpt in the same run directory."""
    import subprocess

    job = os.environ.get("SLURM_JOB_ID", "")
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning(f"could not requeue SLURM job {job} ({error}); resubmit the same command to continue")
        return
    if result.returncode == 0:
        log.warning(f"requeued SLURM job {job}: it continues from its last.ckpt in the same run directory")
    else:
        log.warning(f"scontrol requeue {job} failed ({result.stderr.strip()[:200]}); resubmit the command to continue")
