"""The processes of a run: children that die with it and hold nothing of its, and a stop before training that ends
in one line.

A run forks helpers: DataLoader workers, the `datasets.map` pool that prepares the data. A forked child inherits
every open descriptor, the run directory's lock among them (a `flock` belongs to the open file, which the child then
shares), and a child whose parent was killed with SIGKILL lives on until it notices: seconds to minutes, holding the
lock, so that a `resume=true` right after a crash was refused as "another run is training". `install()` makes every
child forked from then on close the lock's descriptor, die with the process that forked it (Linux's
PR_SET_PDEATHSIG), and leave Ctrl-C to its parent (a terminal sends SIGINT to the whole process group; the parent
stops the children itself). DataLoader workers leave SIGTERM to it too (`dataloader_worker_init`): torch sets its own
handler in them after the fork.

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
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
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


# The signals a job's whole process group receives that the run, not its DataLoader workers, takes.
STOPS_FOR_THE_RUN = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def dataloader_worker_init(worker_id: int) -> None:
    """The `worker_init_fn` of the run's DataLoaders: SIGTERM and Ctrl-C are the run's to take, not its workers'.

    `scancel`, SLURM's time limit, `docker stop` and a terminal's Ctrl-C signal the whole process group, the workers
    with it. torch's own SIGTERM handler in a worker (set after the fork, over `_in_child`'s) ended the worker, and the
    run died mid-batch of "DataLoader worker ... exited unexpectedly": a traceback, exit 1, no checkpoint. Ignored
    here, the signal reaches the main process alone in effect: it stops after the current batch, saves last.ckpt and
    shuts its workers down itself (torch's sentinel on their queues, not a signal). A worker whose run was killed
    (SIGKILL) still dies with it (`install`'s PR_SET_PDEATHSIG; without it, torch's watch of the parent, within 5 s).

    Lightning adds its worker seeding (`seed_everything(workers=True)`) only to a loader without a `worker_init_fn`:
    it runs here instead, with the rank Lightning gives it (the process's global rank), so the workers' seeds are
    the same as before."""
    # SIGUSR1/SIGUSR2 too: SLURM's --signal=USR1@t (without B:) and submitit's USR2 reach every process of the job
    # step, and their default action would end a worker the same way.
    for signum in STOPS_FOR_THE_RUN:
        signal.signal(signum, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        import torch
        from lightning.fabric.utilities.seed import pl_worker_init_function

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        pl_worker_init_function(worker_id, rank=torch.distributed.get_rank() if distributed else 0)


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
    if _signals_during_launch is not None:  # Lightning is starting this process's DDP children: once they are all
        _signals_during_launch.append(signum)  # known, `launching` stops the run here and they end with it
        return
    when = "after training, before its results were written" if _phase == "finishing" else "before training started"
    message = (
        f"lightbert: stopped by {signal.Signals(signum).name} {when}. To continue, rerun the same command with "
        f"hydra.run.dir={_where} resume=true"
    )
    # The DDP processes this one launched end first, before they can see its connections close: left to notice,
    # each printed a C++ frame dump and a DistNetworkError traceback (a stop during the DDP rendezvous).
    end_launched()
    # At once, with no unwinding: a pool whose worker the same signal killed can hang its own clean-up (a lock the
    # dead worker held), and nothing half-built is read later (caches and checkpoints are published whole). The
    # children die with this process (PR_SET_PDEATHSIG).
    for handler in logging.getLogger("lightbert").handlers + logging.getLogger().handlers:
        with suppress(Exception):
            handler.flush()
    with suppress(Exception):
        sys.stdout.flush()
    if _first_of_the_job():  # every process of a job may get the signal (SLURM's, a group's Ctrl-C): one line
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


# -- The DDP processes of a job, and the death of one ---------------------------------------------------------------
#
# `python src/train.py trainer.devices=N` is the job's first process: Lightning's launcher (lightbert.run.launcher)
# starts ranks 1..N-1 by running the command line again, as its children; srun, torchrun or a cluster start every
# process themselves. When one process dies (kill -9, the kernel's out-of-memory killer, a crash), the others learn
# it from the collective they are in (gloo's "Connection reset by peer", NCCL's abort) or never, when they wait for
# it to join the process group. Each process watches the processes it can see end (its children, its launcher, the
# processes of its node once they have met) and the job ends with one line that names the process that died and what
# is saved, said by the lowest-ranked process left.

LAUNCHER_VARIABLE = "LIGHTBERT_LAUNCHER"  # in the environment of the processes a first process launches: "pid:rank"
_launched: list[subprocess.Popen] = []  # in a first process: the DDP processes it launched (ranks 1, 2, ...)
_launcher_pid = 0  # in a DDP process a first process launched: that process (the first of its node)
_launcher_rank = 0
_members: list[dict] = []  # once the process group exists: every process of the job (rank, host, pid)
_world_size = 0
_claimed = threading.Lock()  # the line is said once, by the main thread or by the watch
_job: tuple[Path, bool] | None = None  # while the processes work together: the run directory, and whether it trains
_watching = True  # until this process's part of the job is over
_saving = 0  # checkpoint writes in progress (`writing_checkpoint`): the watch does not cut one short
# How long the watch lets a process whose peer died go on once the process group exists: gloo raises at the next
# collective at once, NCCL only at its timeout (30 minutes). Long enough for the main thread to say it first.
GRACE_SECONDS = 60.0
# How long the watch of a launched process whose launcher died as it started waits for its run directory to be known.
_RUN_DIRECTORY_SECONDS = 10.0
_signals_during_launch: list[int] | None = None  # while `launching`: the stops that came, taken at its end


@contextmanager
def launching(first_rank: int, world_size: int, children: Callable[[], list[subprocess.Popen]]) -> Iterator[None]:
    """Around Lightning's start of this process's DDP children (`children()` once they are started): they learn who
    launched them, start with Ctrl-C blocked (a terminal's Ctrl-C, sent to the whole group, is the first process's
    to take: in the second before a child's own code runs it was a KeyboardInterrupt traceback), and keep torch's
    C++ warnings to errors (a child printed c10d's frame dump about its launcher's closed connection before Python
    could say one line). A stop that comes meanwhile waits until every child is known, and ends them: taken at once,
    the children started so far were left behind, waiting 30 minutes for a rendezvous (seen in CI)."""
    global _world_size, _first_rank, _signals_during_launch
    _world_size, _first_rank = world_size, first_rank
    added = {LAUNCHER_VARIABLE: f"{os.getpid()}:{first_rank}"}
    if "TORCH_CPP_LOG_LEVEL" not in os.environ:
        added["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    os.environ.update(added)
    # Blocked in this thread only: the children inherit the mask; a signal another thread takes still runs the
    # handler here, in the main thread, so `_stop_now` holds it back until the children are known.
    _signals_during_launch = []
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        _launched[:] = children()
        for name in added:
            os.environ.pop(name, None)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a Ctrl-C held back by the mask is taken now
        stops, _signals_during_launch = _signals_during_launch, None
        if stops:
            _stop_now(stops[0], None)


_first_rank = 0  # the rank of this node's first process (its launched children follow it)


def watch_launched() -> None:
    """In a first process, once Lightning has started its DDP children (`launching`): they are watched (`_Watch`)."""
    _Watch().start()


def adopt_launch() -> None:
    """Called first by a command: in a DDP process that a first process launched, Ctrl-C is left to that process
    (`launching` started this one with SIGINT blocked; now ignored, and unblocked), and the launcher is watched."""
    global _launcher_pid, _launcher_rank, _world_size
    pid, _, rank = os.environ.get(LAUNCHER_VARIABLE, "").partition(":")
    if not (pid.isdigit() and rank.isdigit()):
        return
    # Not this process's parent: a process the launched one started (it inherited the variable) while its launcher
    # lives on; or the launcher already died (kill -9 in the seconds this one spent starting), and then the watch
    # ends this one at once, which otherwise waited 30 minutes for it at the rendezvous.
    if int(pid) != os.getppid() and _alive(int(pid)):
        return
    _launcher_pid, _launcher_rank = int(pid), int(rank)
    _world_size = int(os.environ.get("WORLD_SIZE", "0") or 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _Watch().start()


def launched_by_another() -> bool:
    """Whether this is a DDP process that a first process of this machine launched (`adopt_launch`), with the
    command line that process has checked."""
    return _launcher_pid != 0


def record_members(members: list[dict]) -> None:
    """Every process of the job ({"rank", "host", "pid"}), gathered once at start-up (`plugins.agreement`)."""
    global _world_size
    _members[:] = members
    _world_size = len(members)


def end_launched() -> None:
    """Ends the DDP processes this one launched (SIGKILL: they cannot go on without it, and say nothing)."""
    for child in _launched:
        if child.poll() is None:
            child.kill()
    for child in _launched:
        with suppress(Exception):
            child.wait()


@contextmanager
def writing_checkpoint() -> Iterator[None]:
    """A checkpoint write in progress: the watch waits for it (it would be lost, cut short)."""
    global _saving
    _saving += 1
    try:
        yield
    finally:
        _saving -= 1


def _first_of_the_job() -> bool:
    if _launcher_pid:
        return False
    from lightbert.cluster.environment import is_global_zero

    return is_global_zero()


def _my_rank() -> int:
    me = next((m["rank"] for m in _members if m["pid"] == os.getpid() and m["host"] == socket.gethostname()), None)
    if me is not None:
        return me
    if _launcher_pid:
        return _launcher_rank + int(os.environ.get("LOCAL_RANK", "0") or 0)
    return _first_rank


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux: a zombie is dead, its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _how_it_ended(code: int) -> str:
    if code < 0:
        signum = -code
        if signum == signal.SIGKILL:
            return (
                "was killed by SIGKILL, which is what the kernel's out-of-memory killer sends: each process holds the "
                "whole model, its gradients and the optimizer's state; use a smaller model= or fewer trainer.devices"
            )
        return f"was killed by {signal.Signals(signum).name}"
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        return f"was stopped by {signal.Signals(code - 128).name}"
    return f"ended with exit code {code} (its own error is above)"


def lost_processes() -> list[tuple[int | None, str]]:
    """(rank, how it ended) of the job's processes this one sees gone before the job finished."""
    lost: dict[int | None, str] = {}
    for offset, child in enumerate(_launched, start=1):
        code = child.poll()
        if code:  # 0: it finished; None: it runs
            lost[_first_rank + offset] = _how_it_ended(code)
    if _launcher_pid and os.getppid() != _launcher_pid:
        lost[_launcher_rank] = (
            "(the first of this node, which started this one) ended without finishing: killed (kill -9, or the "
            "kernel's out-of-memory killer) or crashed"
        )
    host = socket.gethostname()
    for member in _members:
        known = member["pid"] == os.getpid() or member["pid"] == _launcher_pid or member["rank"] in lost
        if known or member["host"] != host or any(c.pid == member["pid"] for c in _launched):
            continue
        if not _alive(member["pid"]):
            lost[member["rank"]] = "ended before the job finished"
    return sorted(lost.items())


def _a_lower_rank_lives(lost: list[tuple[int | None, str]]) -> bool:
    """Whether a process of a lower rank than this one may still be running: it says the line, not this one."""
    me, gone = _my_rank(), {rank for rank, _ in lost}
    if _launcher_pid and os.getppid() == _launcher_pid:
        return True
    host = socket.gethostname()
    return any(m["rank"] < me and m["rank"] not in gone and (m["host"] != host or _alive(m["pid"])) for m in _members)


def _line(lost: list[tuple[int | None, str]]) -> str:
    rank, how = lost[0]
    world = f" of {_world_size}" if _world_size else ""
    who = f"DDP process {rank}{world}" if rank is not None else "a DDP process"
    where = _job or ((Path(_where), True) if _where else None)  # before training: the run directory it prepares
    return f"{who} {how}; {what_is_saved(*where)}" if where else f"{who} {how}"


def what_is_saved(output_dir: Path, training: bool = True) -> str:
    """What a job that lost a process leaves, and how to go on from it."""
    from lightbert.files import RESULTS_FILE

    if (output_dir / RESULTS_FILE).is_file():
        return f"the run had finished: its results are in {output_dir}"
    if not training:
        return f"nothing was written to {output_dir / RESULTS_FILE}; run the command again"
    last = output_dir / "checkpoints" / "last.ckpt"
    again = f"rerun the same command with hydra.run.dir={output_dir} resume=true"
    if not last.is_file():
        return f"no checkpoint was saved before it; {again} to start again"
    try:
        import torch

        step = f" (step {int(torch.load(last, mmap=True, weights_only=True)['global_step'])})"
    except Exception:
        step = ""
    return f"the newest checkpoint, {last}{step}, is kept; to continue, {again}"


def _distributed_initialized() -> bool:
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed is not None and distributed.is_available() and distributed.is_initialized())


def _looks_like_a_lost_peer(error: BaseException) -> bool:
    """gloo's and NCCL's errors in a collective whose other end has gone, and torch's at the rendezvous."""
    if type(error).__name__ in ("DistNetworkError", "DistBackendError"):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        words in text
        for words in (
            "Connection reset by peer",
            "Connection closed by peer",
            "Broken pipe",
            "NCCL communicator was aborted",
        )
    )


def _lost_after(error: BaseException) -> list[tuple[int | None, str]]:
    """The processes gone when `error` reached this one. A process's connections close as it dies, a moment before
    its parent can collect its status: after a lost connection this waits a little for the death to show."""
    lost = lost_processes()
    if lost or not _looks_like_a_lost_peer(error):
        return lost
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
        lost = lost_processes()
    if not lost:  # on another node, or a process this one cannot see: gloo's words say which connection
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        lost = [(None, f"of this job went away: {first}")]
    return lost


@contextmanager
def naming_lost_processes(output_dir: Path, training: bool = True) -> Iterator[None]:
    """Around what a job's processes do together (training, the results, the end): when a process of the job died,
    the error its death causes here (a gloo or NCCL traceback about a closed connection, from whatever collective
    this process was in) becomes one line that names it and says what is saved, from the lowest-ranked process
    left; the others end quietly (exit 1)."""
    from lightbert.errors import UserError

    global _job
    _job = (Path(output_dir), training)
    try:
        yield
    except UserError:
        raise  # said by this process itself
    except Exception as error:
        lost = _lost_after(error)
        if not lost:
            raise
        end_launched()  # the others cannot go on
        if _a_lower_rank_lives(lost) or not _claimed.acquire(blocking=False):
            sys.exit(1)  # the line is another's to say, or already said
        raise UserError(_line(lost)) from None


def job_done() -> None:
    """This process's part of the job is over (the process group ended): a process that ends after it is no loss."""
    global _watching
    _watching = False


def end_process_group() -> None:
    """Ends the process group Lightning's DDP started, once every process has finished (a failed run leaves it to
    the exit, as a barrier could wait for a process that is gone). Left to the interpreter's exit, gloo's threads
    were seen to abort a finished DDP run ("terminate called without an active exception", exit -6)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no process leaves while another still gathers predictions
        job_done()  # past the last collective: a process that ends now has done its part
        torch.distributed.destroy_process_group()


class _Watch(threading.Thread):
    """Watches the processes of the job that this one sees end (its DDP children, or the process that launched
    it). Once one has died: the others this one launched are ended, and this process too, with the line (said
    once), when its main thread would wait for the dead one: before the process group exists (the rendezvous waits
    for every process for 30 minutes), or, past `GRACE_SECONDS` after the death, in a collective that does not
    fail (NCCL's). A checkpoint being written is let finish. Lightning's own watch SIGKILLed the whole job within 5
    s of a death, mid-way through whatever it was doing, without a word."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="lightbert-process-watch")

    def run(self) -> None:
        while True:
            time.sleep(0.5)
            if not _watching:
                return
            lost = lost_processes()
            if lost:
                break
            if _launched and all(child.poll() == 0 for child in _launched):
                return  # the job finished
        end_launched()
        died = time.monotonic()
        # A launched process whose launcher died while this one started: its main thread is still composing the
        # command's config; the line names the run directory to go on from once it is known (a moment later).
        while _launcher_pid and not (_where or _job) and time.monotonic() - died < _RUN_DIRECTORY_SECONDS:
            time.sleep(0.05)
        while _distributed_initialized() and (time.monotonic() - died < GRACE_SECONDS or _saving):
            time.sleep(0.2)  # the main thread meets the death at its next collective and says it
        if not _watching or not _claimed.acquire(blocking=False):
            return  # the main thread is saying it, or this process's work is done
        if not _a_lower_rank_lives(lost):
            print(f"lightbert: error: {_line(lost)}", file=sys.stderr, flush=True)
        os._exit(2)


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
