"""The run directory, the user's record of a run: what may be trained into it, and what a finished run leaves.

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
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lightbert.cluster import processes
from lightbert.cluster.environment import is_global_zero
from lightbert.errors import UserError
from lightbert.files import RESULTS_FILE, write_atomically
from lightbert.run.settings import RunSettings, Start

log = logging.getLogger(__name__)

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


SLURM_RECORD = Path(".hydra") / "slurm.json"  # RECORD_DIR's


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


def record_slurm_job(output_dir: Path) -> None:
    """The SLURM job a new run was started by, which `requeued` recognises when SLURM starts the job again."""
    if os.environ.get("SLURM_JOB_ID") and is_global_zero():
        write_atomically(output_dir / SLURM_RECORD, json.dumps({"job_id": os.environ["SLURM_JOB_ID"]}) + "\n")


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
    if not output_dir.is_dir() or (output_dir / RECORD_DIR).is_dir():
        return
    foreign = sorted(p.name for p in output_dir.iterdir() if p.name not in RUN_OUTPUTS and not _is_temporary(p))
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


def check_same_kind(path: Path, checkpoint: dict, settings: RunSettings) -> None:
    """Refuses a checkpoint that another kind of run wrote (a fine-tune's last.ckpt copied into a pre-training run,
    a SQuAD one into a GLUE run, an MRPC one into an SST-2 run): Lightning would restore its step, then fail to load
    its weights into this task's model. The kind is the head a fine-tuning module records (`TaskModule.head`; none
    for pre-training) and the GLUE task it was trained on."""
    from hydra.utils import get_class

    wanted = getattr(get_class(str(settings.task.module._target_)), "head", None)
    hyper_parameters = checkpoint.get("hyper_parameters") or {}
    found = checkpoint.get("head")
    if found is None and "objective" not in hyper_parameters:
        return  # written before lightbert recorded heads: nothing to judge it by
    found_task, wanted_task = hyper_parameters.get("task"), settings.task.module.get("task")
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


def remove_stale_temporaries(output_dir: Path) -> None:
    """Temporary files a killed save left (`.last.ckpt.tmp-<host>-<pid>`, up to a checkpoint's size): with the run
    directory locked, no process is writing them any more. Never a finished file."""
    stale = [p for d in (output_dir, output_dir / "checkpoints") if d.is_dir() for p in d.glob(".*.tmp-*")]
    if stale and is_global_zero():
        size = sum(p.stat().st_size for p in stale if p.is_file())
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        log.warning(
            f"removed {len(stale)} temporary file(s) ({size / 2**20:.1f} MB) that a killed save left in {output_dir}"
        )


def save_tokenizer(tokenizer, output_dir: Path) -> None:
    if not is_global_zero():
        return
    # Next to the checkpoints, so a run directory is enough to load the model again.
    tokenizer.save(output_dir / "tokenizer.json")


def results(trainer, output_dir: Path, seconds: float) -> dict[str, Any]:
    """What `results.json` holds: the final metrics, the best checkpoint by the task's monitor, where things are."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    checkpoint = next((c for c in checkpoints if c.monitor), None)  # the best by the task's monitor
    metrics = {name: float(value) for name, value in sorted(trainer.callback_metrics.items())}
    best = checkpoint.best_model_score if checkpoint is not None else None
    monitor = checkpoint.monitor if checkpoint else None
    best_score = float(best) if best is not None else None
    return {
        "metrics": metrics,
        "monitor": monitor,
        "best_score": best_score,
        # The validation metrics of the kept checkpoint, the one test predictions come from (`metrics` are the last
        # validation's): what a results table prints for a task of several metrics (MRPC's F1 and accuracy).
        "best_metrics": best_validation_metrics(output_dir / "metrics.csv", monitor, best_score),
        "global_step": trainer.global_step,
        "best_checkpoint": (checkpoint.best_model_path or None) if checkpoint else None,  # None: no validation ran
        "last_checkpoint": str(output_dir / LAST_CHECKPOINT) if (output_dir / LAST_CHECKPOINT).is_file() else None,
        "tokenizer": str(output_dir / "tokenizer.json"),
        "output_dir": str(output_dir),
        "seconds": round(seconds, 1),
    }


def best_validation_metrics(metrics_csv: Path, monitor: str | None, best: float | None) -> dict[str, float] | None:
    """The val/ metrics of the first validation at which `monitor` reached `best`, from metrics.csv (which a resumed
    run continues, so every validation of the run is there). The first, as ModelCheckpoint keeps the first of equal
    values. None where there is none (no validation, no metrics.csv) or on another process than the first."""
    if monitor is None or best is None or not is_global_zero() or not metrics_csv.is_file():
        return None
    import csv

    with metrics_csv.open(newline="") as file:
        for row in csv.DictReader(file):
            value = row.get(monitor)
            if value and float(value) == best:  # the same float32 value, logged and kept
                return {k: float(v) for k, v in row.items() if k.startswith("val/") and v not in (None, "")}
    return None


def write_results(results: dict[str, Any], output_dir: Path) -> None:
    """results.json, and one console line that says how the run ended and where its outputs are (first process)."""
    if not is_global_zero():
        return
    write_atomically(output_dir / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    metrics = results["metrics"]
    shown = [f"{k}={v:.4f}" for k, v in metrics.items() if k.startswith("val/")][:6]
    if results.get("evaluated"):  # src/evaluate.py: no training, no checkpoint
        outputs = _existing(output_dir, [RESULTS_FILE, "metrics.csv", "predictions/"])
        print(
            f"lightbert: evaluated {results['evaluated']} in {results['seconds']:.0f}s ({', '.join(shown)}). "
            f"Outputs in {output_dir}: {', '.join(outputs)}"
        )
        return
    if results["monitor"] and results["best_score"] is not None:
        shown.append(f"best {results['monitor']}={results['best_score']:.4f}")
    if not shown:
        shown = [
            "no validation ran: raise trainer.max_steps or trainer.max_epochs, or lower trainer.val_check_interval"
        ]
    outputs = _existing(output_dir, [RESULTS_FILE, "metrics.csv", "checkpoints/", "tokenizer.json", "predictions/"])
    print(
        f"lightbert: finished {results['global_step']} steps in {results['seconds']:.0f}s ({', '.join(shown)}). "
        f"Outputs in {output_dir}: {', '.join(outputs)}"
    )


def _existing(output_dir: Path, names: list[str]) -> list[str]:
    """The outputs the run did leave (a run of 0 epochs writes no metrics.csv and no checkpoint)."""
    return [name for name in names if (output_dir / name.rstrip("/")).exists()]


RECORD_DIR = ".hydra"  # where Hydra would write it; lightbert writes it once the run's checks have passed
# What a resumed run may set differently from the run it continues: where metrics go, what observes the run
# (callbacks) and how progress is shown. Everything else (data, model, optimiser, length) continues as recorded.
CHANGEABLE_ON_RESUME = ("resume", "logger", "callbacks", "trainer.enable_progress_bar", "trainer.log_every_n_steps")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


# Where lightbert's classes lived before the package took its present layout (the Trainer's plug-ins in run/ and
# checkpoints/, each task folder at the top), so that a run recorded then resumes now: a recorded `_target_` under an
# old module path names the class the new path names.
PLUGINS_MOVED = {
    "run.callbacks": "plugins.callbacks",
    "run.agreement": "plugins.agreement",
    "run.loggers": "plugins.loggers",
    "run.strategies": "plugins.strategies",
    "checkpoints.saving": "plugins.checkpointing",
}


def _moved_to_today(value: Any) -> Any:
    import pkgutil

    import lightbert.tasks

    moved = {f"lightbert.{old}.": f"lightbert.{new}." for old, new in PLUGINS_MOVED.items()}
    moved |= {
        f"lightbert.{p.name}.": f"lightbert.tasks.{p.name}." for p in pkgutil.iter_modules(lightbert.tasks.__path__)
    }
    if isinstance(value, str):
        for old, new in moved.items():
            if value.startswith(old):
                return new + value[len(old) :]
    return value


def _override_key(override: str) -> str:
    """The key of a command-line override: `speed.fp8` for `speed.fp8=true`, `+callbacks.x=...`, `~logger`."""
    return override.split("=", 1)[0].lstrip("+~")


# What a resume may change when the checkpoint says the global batch stays the same (`preflight._resized`): the devices
# and nodes a requeued job gets, and the accumulation that keeps the global batch.
RESIZABLE_ON_RESUME = ("trainer.devices", "trainer.num_nodes", "trainer.accumulate_grad_batches")


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def _changed_choices(record: Path) -> list[tuple[str, Any, Any]]:
    """(group, recorded option, option now) for each config group whose option this command changes, from the
    record's `hydra.yaml` and this run's Hydra config; none where either is missing (a run started by `train(cfg)`)."""
    hydra_record = record / "hydra.yaml"
    if not hydra_record.is_file() or not HydraConfig.initialized():
        return []
    before = OmegaConf.to_container(OmegaConf.load(hydra_record).hydra.runtime.choices)
    after = OmegaConf.to_container(HydraConfig.get().runtime.choices)
    return [
        (group, before.get(group), after.get(group))
        for group in sorted(set(before) | set(after))
        if before.get(group) != after.get(group)
        and not group.startswith("hydra")
        and not any(_under(group, c) for c in CHANGEABLE_ON_RESUME)
    ]


def record_run(
    config: DictConfig,
    overrides: tuple[str, ...],
    output_dir: Path,
    resuming: bool,
    resized: bool = False,
    sources: dict[str, Any] | None = None,
) -> None:
    """The run's record in `.hydra/`: the config (as composed, interpolations kept), the command line's overrides
    and, in a Hydra run, Hydra's own config; and what its data is read from (`sources`: `.hydra/data.json`). A
    resumed run continues the run as recorded: a setting it changes is refused with the keys named (only
    `CHANGEABLE_ON_RESUME` may change), so is other data, and the record is left as it was. The checks come first: a
    refused command writes nothing. Then the temporary files a killed save left are removed."""
    record = output_dir / RECORD_DIR
    config = OmegaConf.to_container(config, resolve=False)
    settings_recorded = resuming and (record / "config.yaml").is_file()
    data_record = output_dir / DATA_RECORD
    if settings_recorded:
        recorded = _flat(OmegaConf.to_container(OmegaConf.load(record / "config.yaml"), resolve=False))
        recorded = {key: _moved_to_today(v) if key.endswith("_target_") else v for key, v in recorded.items()}
        now = _flat(config)
        # A setting that an earlier lightbert did not have (e.g. speed.fp8) is not in that run's record: at its
        # default, it changes nothing, so the run resumes; set on this command line, it is a change like any other.
        overridden = {_override_key(o) for o in overrides}
        changed = [
            key
            for key in sorted(set(recorded) | set(now))
            if recorded.get(key) != now.get(key)
            and not any(_under(key, c) for c in CHANGEABLE_ON_RESUME)
            and not (resized and key in RESIZABLE_ON_RESUME)
            and (key in recorded or any(_under(key, o) for o in overridden))
        ]
        if changed:
            # A group's option changed (trainer=ddp for trainer=fsdp) is named as the command line says it, not as
            # the keys under it that differ.
            groups = [c for c in _changed_choices(record) if any(_under(key, c[0].split("/")[0]) for key in changed)]
            keys = [key for key in changed if not any(_under(key, group.split("/")[0]) for group, _, _ in groups)]
            shown = [f"{g}={before} recorded, {g}={after} now" for g, before, after in groups]
            shown += [f"{k}: {recorded.get(k)!r} recorded, {now.get(k)!r} now" for k in keys]
            raise UserError(
                f"resume=true continues the run in {output_dir} as recorded in {record / 'config.yaml'}, and this "
                f"command changes {len(shown)} setting(s): {'; '.join(shown[:6])}. Drop those overrides to resume, "
                "or start a new run in another directory (e.g. with init_from=<this run> to fine-tune from it)"
            )
    # A resumed run must read the data it started with, or it would continue on other examples and another
    # validation set without a word (a run recorded before lightbert kept data.json is not checked).
    if resuming and sources is not None and data_record.is_file():
        recorded = json.loads(data_record.read_text())
        changed = [name for name in sorted(set(recorded) | set(sources)) if recorded.get(name) != sources.get(name)]
        if changed:
            raise UserError(
                f"resume=true continues the run in {output_dir} on the data it started with, and {len(changed)} of "
                f"its sources changed since ({', '.join(changed[:3])}: another size, time or file). Restore them, or "
                "start a new run in another directory (init_from=<this run> starts from its weights)"
            )
    remove_stale_temporaries(output_dir)
    if not is_global_zero():
        return
    if not settings_recorded:
        record_slurm_job(output_dir)
        write_atomically(record / "config.yaml", OmegaConf.to_yaml(config))
        write_atomically(record / "overrides.yaml", OmegaConf.to_yaml(list(overrides)))
        if HydraConfig.initialized():
            write_atomically(record / "hydra.yaml", OmegaConf.to_yaml({"hydra": HydraConfig.get()}))
    if not resuming and sources is not None:
        write_atomically(data_record, json.dumps(sources, indent=2) + "\n")


DATA_RECORD = Path(RECORD_DIR) / "data.json"


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
    (or a requeued SLURM job) continues. An evaluation starts a new directory."""
    output_dir = settings.output_dir
    with locked(output_dir), refused_leaves_nothing(output_dir), processes.ddp_children_of_this_job():
        again = not evaluation and requeued(output_dir)
        resume_from = check_output_dir(output_dir, (settings.resume and not evaluation) or again)
        step = checkpoint_step(resume_from, settings) if resume_from is not None else 0
        yield Start(resume_from, step, again)


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
