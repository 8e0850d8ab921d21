"""The run directory, the user's record of a run: held for one run at a time (`held`, `locked`), what may be
trained into it (a finished run's is not; an unfinished one only to continue it), and how a run starts there
(`Start`: from the beginning, or from the checkpoint that resume=true or a requeued SLURM job continues). What a
run writes into it is `run.record`'s (`.hydra/`, before training) and `run.outputs`'s (results.json, at the end).

Light to import (torch and Lightning only inside the functions that need them): the entry point refuses a command
with these checks before it loads the rest, in a second rather than several.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lightbert.cluster import processes
from lightbert.cluster.environment import is_global_zero
from lightbert.errors import UserError
from lightbert.files import RESULTS_FILE
from lightbert.run.settings import RunSettings

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
RECORD_DIR = ".hydra"  # where Hydra would write it; lightbert writes it once the run's checks have passed
DATA_RECORD = Path(RECORD_DIR) / "data.json"
SLURM_RECORD = Path(RECORD_DIR) / "slurm.json"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """How the run starts, decided under the run directory's lock (`run_dir.held`): from the beginning, or from
    the step of the checkpoint it resumes (asked with resume=true, or a requeued SLURM job)."""

    resume_from: Path | None = None
    step: int = 0
    requeued: bool = False

    @property
    def resuming(self) -> bool:
        return self.resume_from is not None


def requeued(output_dir: Path) -> bool:
    """Whether this is a SLURM job that SLURM started again (`scontrol requeue` after a preemption or the time
    limit: the same job id, `SLURM_RESTART_COUNT` >= 1) on the run it recorded in `output_dir`: it continues that
    run, as resume=true would, without being told."""
    job, restarts = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_RESTART_COUNT", "0")
    if not job or not restarts.isdigit() or int(restarts) < 1 or not (output_dir / SLURM_RECORD).is_file():
        return False
    try:
        return json.loads((output_dir / SLURM_RECORD).read_text()).get("job_id") == job
    except (OSError, json.JSONDecodeError):
        return False


def check_output_dir(output_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to resume from, if any. Nothing a user saved is ever lost: a finished run's directory is
    not trained into again, an unfinished one only to continue it, and a directory that is not a run's (it holds
    files, and no .hydra/ record) not at all."""
    _check_is_a_run_directory(output_dir)
    if (output_dir / RESULTS_FILE).exists():
        raise UserError(
            f"{output_dir} already holds a finished run ({RESULTS_FILE}); choose another directory "
            "with hydra.run.dir=... or leave it to the default, which is new for every run"
        )
    checkpoints = output_dir / LAST_CHECKPOINT.parent
    if checkpoints.exists() and (not checkpoints.is_dir() or not os.access(checkpoints, os.W_OK | os.X_OK)):
        # Found now, not when the first checkpoint is written after hours of training.
        problem = "a file, not a directory" if not checkpoints.is_dir() else "not writable"
        raise UserError(f"{checkpoints} is {problem}: the run could not save its checkpoints; fix it, or choose "
                        "another directory with hydra.run.dir=...")  # fmt: skip
    last = output_dir / LAST_CHECKPOINT
    if not resume and not last.is_file() and (output_dir / "metrics.csv").is_file():
        raise UserError(
            f"{output_dir} holds a metrics.csv from another run, which this one would replace; choose another "
            f"directory with hydra.run.dir=..., or continue that run with hydra.run.dir={output_dir} resume=true"
        )
    if resume:
        return last if last.is_file() else None  # nothing to resume yet: train() says so, after the run directory
    if last.is_file():
        raise UserError(
            f"{output_dir} holds an unfinished run ({LAST_CHECKPOINT}); continue it with hydra.run.dir={output_dir} "
            "resume=true, or choose another directory with hydra.run.dir=..."
        )
    return None


# Names a run writes that the checks below judge with their own messages (a finished run, a lost checkpoint, a
# metrics.csv); any other file in a directory without a run's .hydra/ record is someone else's.
RUN_OUTPUTS = ("checkpoints", "metrics.csv", "results.json", "train.log", "hparams.yaml", "predictions")


def _check_is_a_run_directory(output_dir: Path) -> None:
    """Refuses a directory that holds files lightbert did not write (a Hugging Face export, a project, the current
    directory): a run would add its record there and could replace a file of the same name (tokenizer.json)."""
    if not output_dir.is_dir():
        return
    # One listing, judged as a whole: the job's first process may write the record while another process of the
    # job (a SLURM task, started at the same moment in the same directory) checks it. A record seen in the listing
    # makes it a run's directory, not a foreign file (seen once in 20 jobs, which then waited for a refused task).
    entries = list(output_dir.iterdir())
    if any(p.name == RECORD_DIR and p.is_dir() for p in entries):
        return
    foreign = sorted(p.name for p in entries if p.name not in RUN_OUTPUTS and not _is_temporary(p))
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise UserError(
            f"{output_dir} is not a run directory: it holds {len(foreign)} file(s) a run did not write ({shown}). "
            "Train into a new or empty directory: choose another with hydra.run.dir=..., or leave it to the default"
        )


def _is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and ".tmp-" in path.name  # a killed save's (remove_stale_temporaries)


def checkpoint_step(path: Path, settings: RunSettings | None = None) -> int:
    """The global step of a checkpoint to resume from, read without loading its weights (mmap); a file that is no
    checkpoint (truncated by a full disk, or something else) is one message, not torch's traceback. With
    `settings`, a checkpoint of another kind of run than theirs is refused too (`check_same_kind`)."""
    damaged = damaged_record(path)
    if damaged is not None:
        raise UserError(f"{path} is damaged ({damaged}): the run cannot resume from it. {_older_to_resume_from(path)}")
    try:
        import torch

        checkpoint = torch.load(path, mmap=True, weights_only=True)
        step = int(checkpoint["global_step"])
    except Exception as error:
        raise UserError(
            f"{path} cannot be read as a checkpoint ({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
            "the run cannot resume from it. Start a new run directory (init_from=<an earlier checkpoint of it> starts "
            "from its weights), or restore a good last.ckpt"
        ) from None
    if settings is not None:
        check_same_kind(path, checkpoint, settings)
    return step


def damaged_record(path: Path) -> str | None:
    """What of a checkpoint file is damaged, or None: each record of its zip checked against its checksum (torch.load
    reads changed bytes inside a tensor without a word, and its mmap read of the step does not touch them)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"not a whole checkpoint: {str(error)[:200]}"
    return f"{bad} fails its checksum" if bad is not None else None


def _older_to_resume_from(damaged: Path) -> str:
    """What to go on from instead of a damaged checkpoint, keeping the damaged file: the newest whole checkpoint of
    the run that holds its training state (resumed exactly), else the newest whole one of weights alone (the best
    by validation: a new run starts from them), else nothing."""
    import torch

    whole = []
    for other in damaged.parent.glob("*.ckpt"):
        if other == damaged or damaged_record(other) is not None:
            continue
        try:
            checkpoint = torch.load(other, mmap=True, weights_only=True)
            whole.append(("optimizer_states" in checkpoint, int(checkpoint["global_step"]), other))
        except Exception:  # another unreadable file: not one to go on from
            continue
    if not whole:
        return "No other checkpoint of the run is whole: restore last.ckpt from a copy, or start a new run directory"
    state, step, older = max(whole)
    if state:
        return (
            f"{older.name} (step {step}) is whole: resume from it with `mv {damaged} {damaged}.damaged && cp {older} "
            f"{damaged}`, then the same command"
        )
    return (
        f"No other checkpoint holds the training state; {older.name} (step {step}) holds its weights: start a new run "
        f"from them with init_from={older} and another hydra.run.dir"
    )


def check_same_kind(path: Path, checkpoint: dict, settings: RunSettings) -> None:
    """Refuses a checkpoint that another kind of run wrote (a fine-tune's last.ckpt copied into a pre-training run,
    a SQuAD one into a GLUE run, an MRPC one into an SST-2 run): Lightning would restore its step, then fail to load
    its weights into this task's model. The kind is the head a fine-tuning module records (`TaskModule.head`; none
    for pre-training) and the GLUE task it was trained on."""
    wanted = getattr(settings.task.module_class, "head", None)
    hyper_parameters = checkpoint.get("hyper_parameters") or {}
    found = checkpoint.get("head")
    if found is None and "objective" not in hyper_parameters:
        return  # written before lightbert recorded heads: nothing to judge it by
    found_task, wanted_task = hyper_parameters.get("task"), settings.task.module_arguments.get("task")
    if found == wanted and (found_task is None or wanted_task is None or found_task == wanted_task):
        return

    def kind(head: str | None, task: str | None) -> str:
        if head is None:
            return "pre-training"
        return f"fine-tuning ({head.replace('_', ' ')}{f', {task}' if task else ''})"

    raise UserError(
        f"{path} is a checkpoint of {kind(found, found_task)}, and this command (task="
        f"{settings.task.option or settings.task.name}) runs {kind(wanted, wanted_task)}: resume=true continues a run "
        "with the task that wrote the checkpoint. Rerun that run's own command to resume it, or start a new run "
        f"directory from its weights with init_from={path}"
    )


@contextmanager
def refused_leaves_nothing(output_dir: Path) -> Iterator[None]:
    """A command refused after its record was begun (a bad row found while the data is prepared, a tokenizer that
    does not fit) takes back what it wrote, when the directory was empty as it took it and nothing was trained:
    everything there is then this command's own (.hydra/, train.log, tokenizer.json, hparams.yaml). A directory
    that held anything, or a run that saved a checkpoint or a metric, is left as it is."""
    was_empty = is_global_zero() and output_dir.is_dir() and not any(output_dir.iterdir())
    try:
        yield
    except UserError:
        trained = (output_dir / LAST_CHECKPOINT).exists() or (output_dir / "metrics.csv").exists()
        if was_empty and not trained:
            for path in list(output_dir.iterdir()):
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        raise


@contextmanager
def held(settings: RunSettings, evaluation: bool = False) -> Iterator[Start]:
    """The run directory held for this run (`locked`), what a refused command wrote there taken back
    (`refused_leaves_nothing`), and the job's DDP processes ended with it. Yields how the run starts (`Start`),
    decided here once, under the lock: from the beginning, or from the checkpoint that resume=true
    (or a requeued SLURM job) continues, and said. An evaluation starts a new directory."""
    output_dir = settings.output_dir
    with locked(output_dir), refused_leaves_nothing(output_dir), processes.ddp_children_of_this_job():
        again = not evaluation and requeued(output_dir)
        resume_from = check_output_dir(output_dir, (settings.resume and not evaluation) or again)
        step = checkpoint_step(resume_from, settings) if resume_from is not None else 0
        start = Start(resume_from, step, again)
        log.info(f"run directory: {output_dir}")  # first on the console (train.log holds it until the checks pass)
        _say_how_it_starts(settings, start)
        yield start


def _say_how_it_starts(settings: RunSettings, start: Start) -> None:
    output_dir = settings.output_dir
    if start.requeued:
        job, restarts = os.environ["SLURM_JOB_ID"], os.environ["SLURM_RESTART_COUNT"]
        log.info(f"SLURM job {job} was requeued ({restarts} restart(s)): continuing its run")
    if (settings.resume or start.requeued) and not start.resuming:
        kept = _metric_rows(output_dir / "metrics.csv")
        also = f"; metrics.csv keeps the {kept} row(s) of the earlier attempt and continues after them" if kept else ""
        log.info(f"resume=true and no {output_dir / LAST_CHECKPOINT} yet: starting from the beginning{also}")


def _metric_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(newline="") as file:
        return max(0, sum(1 for _ in file) - 1)


@contextmanager
def locked(output_dir: Path) -> Iterator[None]:
    """Holds the run directory for this run: a second run started into it at the same time is refused (the lock
    is on the directory itself, so nothing is written into it, and the system drops it when the process ends,
    however it ends). Only the first process of a run takes it; the other DDP processes run inside."""
    if not is_global_zero():
        yield
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    handle = os.open(output_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"another run is training in {output_dir} right now; wait for it to finish, or choose another "
                "directory with hydra.run.dir=..."
            ) from None
        # Forked helpers (DataLoader workers, the data-preparation pool) must not hold it: a resume right after a
        # crash would wait for them.
        processes.hold_in_this_process_only(handle)
        yield
    finally:
        processes.release(handle)
        os.close(handle)
