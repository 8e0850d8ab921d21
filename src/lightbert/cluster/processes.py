"""The processes of a run: children that die with it and hold nothing of its, and a stop before training that ends
in one line.

A run forks helpers: DataLoader workers, the `datasets.map` pool that prepares the data. A forked child inherits
every open descriptor, the run directory's lock among them (a `flock` belongs to the open file, which the child then
shares), and a child whose parent was killed with SIGKILL lives on until it notices: seconds to minutes, holding the
lock, so that a `resume=true` right after a crash was refused as "another run is training". `install()` makes every
child forked from then on close the lock's descriptor, die with the process that forked it (Linux's
PR_SET_PDEATHSIG), and leave Ctrl-C to its parent (a terminal sends SIGINT to the whole process group; the parent
stops the children itself).

SIGTERM or Ctrl-C outside training (while the tokenizer, the examples or a cache are being built, or the predictions
written) ends the run with one line that names its directory; during training Lightning's own handler takes SIGTERM
and `lightbert.plugins.checkpointing.LatestCheckpoint` takes Ctrl-C (a checkpoint first): `training_started()` and
`training_ended()` hand them over and back.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_lock_descriptors: set[int] = set()
_installed = False
_forking_pid = 0


def hold_in_this_process_only(descriptor: int) -> None:
    """`descriptor` (a lock) is closed in every child forked from now on, so only this process holds it."""
    _lock_descriptors.add(descriptor)


def release(descriptor: int) -> None:
    _lock_descriptors.discard(descriptor)


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _in_child() -> None:
    global _phase
    _phase = ""  # a child is no run: the handlers below are the parent's business
    for descriptor in list(_lock_descriptors):
        with suppress(OSError):
            os.close(descriptor)
    _lock_descriptors.clear()
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its children; no traceback from each
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler below: a child just ends
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            return
        if os.getppid() != _forking_pid:  # the parent died between fork and prctl
            os._exit(1)


def install() -> None:
    """From now on, children forked by this process (and by its children) hold no lock of the run's and die with
    the process that forked them. Once per process."""
    global _installed
    if not _installed:
        os.register_at_fork(before=_before_fork, after_in_child=_in_child)
        _installed = True


# What the run is doing: "training" leaves SIGTERM to Lightning's handler (and Ctrl-C to LatestCheckpoint's);
# "preparing" (before training) and "finishing" (predictions, results) end the process at once; "" outside a run.
_phase = ""
_where = ""  # the run directory, for the line that says how to continue
_owner = 0  # the run's own process


def _stop_now(signum: int, frame: Any) -> None:
    if os.getpid() != _owner:  # a child forked without the hooks above: it just ends, as it would have
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _phase not in ("preparing", "finishing"):
        return
    when = "after training, before its results were written" if _phase == "finishing" else "before training started"
    message = (
        f"lightbert: stopped by {signal.Signals(signum).name} {when}. To continue, rerun the same command with "
        f"hydra.run.dir={_where} resume=true"
    )
    # At once, with no unwinding: a pool whose worker the same signal killed can hang its own clean-up (a lock the
    # dead worker held), and nothing half-built is read later (caches and checkpoints are published whole). The
    # children die with this process (PR_SET_PDEATHSIG).
    for handler in logging.getLogger("lightbert").handlers + logging.getLogger().handlers:
        with suppress(Exception):
            handler.flush()
    with suppress(Exception):
        sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    os._exit(128 + signum)


@contextmanager
def stops_cleanly(output_dir: str | os.PathLike) -> Iterator[None]:
    """SIGTERM or Ctrl-C outside training ends the process with one line and the signal's exit code; the previous
    handlers come back afterwards."""
    global _phase, _where, _owner
    _phase, _where, _owner = "preparing", str(output_dir), os.getpid()
    previous = {
        s: signal.signal(s, _stop_now)
        for s in (signal.SIGTERM, signal.SIGINT)
        if signal.getsignal(s) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        _phase = ""
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def training_started() -> None:
    """From here Lightning's SIGTERM handler (which calls `_stop_now` too, a no-op now) stops the run after a batch."""
    global _phase
    if _phase:
        _phase = "training"


def training_ended() -> None:
    global _phase
    if _phase:
        _phase = "finishing"


def killed_ranks(trainer: Any) -> list[tuple[int, int]]:
    """(rank, signal) of the DDP processes this one launched that a signal ended (`python src/train.py` launches
    ranks 1..N-1 itself: Lightning's subprocess launcher)."""
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    killed = []
    for rank, child in enumerate(getattr(launcher, "procs", None) or [], start=1):
        if child.poll() is not None and child.returncode < 0:
            killed.append((rank, -child.returncode))
    return killed


@contextmanager
def naming_killed_ranks(trainer: Any) -> Iterator[None]:
    """A DDP process killed by a signal (the kernel's out-of-memory killer sends SIGKILL) breaks the collective the
    others wait in: their error is a gloo or NCCL traceback about a closed connection. This says which rank died,
    how, and what to do, in one line."""
    try:
        yield
    except Exception:
        killed = killed_ranks(trainer)
        if not killed:
            raise
        from lightbert.errors import UserError

        rank, signum = killed[0]
        # Lightning's observer thread SIGKILLs this process too once it notices the dead rank (every 5 s), which
        # would cut this line's exit short (exit -9): the ranks still alive are ended here, as it would end them,
        # and its list of them emptied (the same list object), so it finds nothing left to do.
        children = trainer.strategy.launcher.procs
        for child in children:
            if child.poll() is None:
                child.kill()
        children.clear()
        why = (
            "SIGKILL, which is what the kernel's out-of-memory killer sends: each process holds the whole model, its "
            "gradients and the optimizer's state; use a smaller model= or fewer trainer.devices"
            if signum == signal.SIGKILL
            else signal.Signals(signum).name
        )
        raise UserError(f"DDP process {rank} of {trainer.world_size} was killed by {why}") from None


# Hydra multirun with DDP. Lightning launches ranks 1..N-1 by re-running the command line (`-m` and the sweep
# included) and, once it has, takes every later job's processes as launched by someone else (it set LOCAL_RANK), so
# each child ran the whole sweep in lock-step with the parent: a job the parent refused, or a child that started
# its next job before the parent had made that job's directory, left a rank waiting for the other for good (seen in
# CI as a hung sweep). Instead each job launches its own children, which run that job alone and end with it.
DDP_JOB = "LIGHTBERT_DDP_JOB"  # the multirun job a DDP child runs: its overrides and its directory
_LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", DDP_JOB)


@contextmanager
def ddp_children_of_this_job() -> Iterator[None]:
    """Around a multirun job: the DDP processes Lightning launches run this job only (`ddp_child_argv`), and the
    next job launches its own (on a new port). Processes a cluster or torchrun launched (LOCAL_RANK already set) are
    left as they are."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if "LOCAL_RANK" in os.environ or not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        yield
        return
    import json

    hydra_config = HydraConfig.get()
    before = {name: os.environ.get(name) for name in _LAUNCH_VARIABLES}
    os.environ[DDP_JOB] = json.dumps(
        {"overrides": list(hydra_config.overrides.task), "output_dir": hydra_config.runtime.output_dir}
    )
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ddp_child_argv(argv: list[str]) -> list[str]:
    """The command line of a DDP child of a multirun job: that job's overrides in its own directory, a single run,
    in place of the sweep Lightning passes on (`ddp_children_of_this_job`). Any other command line as it is."""
    job = os.environ.get(DDP_JOB)
    # Not by -m alone: a config can make the multirun (sweep=paper_grid, experiment=glue_benchmark set hydra.mode).
    if not job or os.environ.get("LOCAL_RANK", "0") == "0":
        return argv
    import json

    job = json.loads(job)
    lightning_settings = [a for a in argv if a.startswith(("hydra.job.name=", "hydra.output_subdir="))]
    # hydra.mode=RUN: a job's overrides may name a config that makes a multirun (sweep=paper_grid,
    # experiment=glue_benchmark); the child runs this one job.
    return [*job["overrides"], f'hydra.run.dir="{job["output_dir"]}"', "hydra.mode=RUN", *lightning_settings]
