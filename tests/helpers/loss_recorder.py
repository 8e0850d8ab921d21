"""Callbacks that the resume and DDP tests add to real runs:
`+callbacks.x._target_=helpers.loss_recorder.RecordLosses`."""

import os
import signal
from pathlib import Path

import lightning as L


class RecordLosses(L.Callback):
    """Appends "global_step rank loss.hex() batch_length" for every training batch to `path`, flushed at once."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        with open(self.path, "a") as f:
            loss, length = float(outputs["loss"]).hex(), batch["input_ids"].shape[1]
            f.write(f"{trainer.global_step} {trainer.global_rank} {loss} {length}\n")


class KillAtStep(L.Callback):
    """SIGKILLs the whole run (every process of its group) once `step` optimizer steps are done: a hard crash."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and trainer.global_rank == 0:
            os.killpg(os.getpgid(0), signal.SIGKILL)


class KillMainAtStep(L.Callback):
    """SIGKILLs the main process alone once `step` optimizer steps are done, as the OOM killer does: its DataLoader
    workers are left to notice."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)


class KillRankAtStep(L.Callback):
    """SIGKILLs DDP process `rank` alone once `step` optimizer steps are done, as the OOM killer does to one rank."""

    def __init__(self, step: int, rank: int = 1):
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAtStep(L.Callback):
    """Sends this process `name` (TERM, USR2) once `step` optimizer steps are done, as SLURM does before the end."""

    def __init__(self, step: int, name: str = "TERM"):
        self.step, self.signum, self.sent = step, getattr(signal, f"SIG{name}"), False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and trainer.global_rank == 0 and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def recorded(path: Path) -> dict[tuple[int, int], list[str]]:
    """What `RecordLosses` wrote: (global_step after the batch, rank) -> the losses of that step's batches, as exact
    hex floats."""
    losses: dict[tuple[int, int], list[str]] = {}
    for line in path.read_text().splitlines():
        step, rank, loss, _ = line.split()
        losses.setdefault((int(step), int(rank)), []).append(loss)
    return losses


def global_norm(tensors) -> float:
    import torch

    return float(torch.linalg.vector_norm(torch.stack([t.detach().float().norm() for t in tensors])))


class RecordGradNorms(L.Callback):
    """Appends "raw applied" per optimizer step to `path`: the gradients' global L2 norm as backward left them
    (before clipping) and as the optimizer's step used them (after clipping; read in a post-step hook, because
    Lightning runs forward and backward inside `optimizer.step(closure)`, and neither optimizer changes them)."""

    def __init__(self, path: str):
        self.path, self.raw = path, None

    def on_train_start(self, trainer, module):
        for optimizer in trainer.optimizers:
            optimizer.register_step_post_hook(self._applied)

    def on_before_optimizer_step(self, trainer, module, optimizer):  # Lightning calls it before clipping
        self.raw = global_norm(p.grad for p in module.parameters() if p.grad is not None)

    def _applied(self, optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        with open(self.path, "a") as f:
            f.write(f"{self.raw} {global_norm(grads)}\n")


class KillDuringSave(L.Callback):
    """SIGKILLs the whole run in the middle of its next checkpoint save once `step` steps are done: the checkpoint
    is written to its temporary file, and the process dies before renaming it into place."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and trainer.global_rank == 0:
            import lightbert.plugins.checkpointing
            from lightbert.files import temporary_path

            def write_then_die(path, write):
                write(temporary_path(path))
                os.killpg(os.getpgid(0), signal.SIGKILL)

            lightbert.plugins.checkpointing.replace_atomically = write_then_die


class TouchAtStep(L.Callback):
    """Writes `path` once the first process has trained `step` steps: a test waiting to signal a run mid-training
    knows it is training (each step after it is a batch with its collectives, where a signal may land)."""

    def __init__(self, path: str, step: int):
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.is_global_zero:
            open(self.path, "w").close()


class StopAtStep(L.Callback):
    """Ends training after `step` steps, as a run that reached its max_steps does (a callback may change on resume,
    trainer.max_steps may not)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class RecordExamples(L.Callback):
    """Appends "step rank digest" for every example of every training batch to `path`: the optimizer step the batch
    trains (accumulated micro-batches share it) and the digest of the example's token ids (masked by its own seed, so
    the same example reads the same on any rank): which examples each step saw."""

    def __init__(self, path: str):
        self.path = path

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        import hashlib

        with open(self.path, "a") as f:
            for row in batch["input_ids"].tolist():
                digest = hashlib.sha1(str([t for t in row if t]).encode()).hexdigest()[:16]
                f.write(f"{trainer.global_step + 1} {trainer.global_rank} {digest}\n")


class RecordShards(L.Callback):
    """Appends "rank name local_shape global_shape" to `path` at the start of training for a Transformer block's weight
    and the word embeddings (tied to the MLM decoder): what each process of an FSDP run holds."""

    def __init__(self, path: str):
        self.path = path

    def on_train_start(self, trainer, module):
        from torch.distributed.tensor import DTensor

        bert = module.model.bert
        weights = {
            "qkv": bert.encoder.layer[0].attention.self.qkv.weight,
            "word_embeddings": bert.embeddings.word_embeddings.weight,
        }
        tied = module.model.cls.predictions.decoder.weight is weights["word_embeddings"]
        with open(self.path, "a") as f:
            for name, weight in weights.items():
                local = weight.to_local() if isinstance(weight, DTensor) else weight
                shape = "x".join(map(str, local.shape)), "x".join(map(str, weight.shape))
                f.write(f"{trainer.global_rank} {name} {shape[0]} {shape[1]} {type(weight).__name__} {tied}\n")


class KillRankAtTrainEnd(L.Callback):
    """SIGKILLs DDP process `rank` alone once training has ended (its last checkpoint written), before the run's
    results: a death at the end of a run."""

    def __init__(self, rank: int = 0):
        self.rank = rank

    def on_train_end(self, trainer, module):
        if trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalWhileLaunching(L.Callback):
    """In the first DDP process, right after Lightning has started the other processes and before its launch is
    over (the moment a stop left them behind): sends the whole process group SIGINT, as a terminal's Ctrl-C, or
    SIGKILLs this process alone, as the out-of-memory killer."""

    def __init__(self, name: str = "INT"):
        from lightbert.plugins.launcher import RunLauncher

        signum, start_children = getattr(signal, f"SIG{name}"), RunLauncher._call_children_scripts

        def start_then_signal(launcher):
            start_children(launcher)
            if signum == signal.SIGKILL:
                os.kill(os.getpid(), signum)
            os.killpg(os.getpgid(0), signum)

        RunLauncher._call_children_scripts = start_then_signal
