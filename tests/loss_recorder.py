"""Callbacks that the resume and DDP tests add to real runs: `+callbacks.x._target_=loss_recorder.RecordLosses`."""

import os
import signal

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


class SignalAtStep(L.Callback):
    """Sends this process `name` (TERM, USR2) once `step` optimizer steps are done, as SLURM does before the end."""

    def __init__(self, step: int, name: str = "TERM"):
        self.step, self.signum, self.sent = step, getattr(signal, f"SIG{name}"), False

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step and trainer.global_rank == 0 and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)
