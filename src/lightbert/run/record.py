"""What a run writes into its run directory (`run.run_dir` holds it): the record in `.hydra/` (the config as
composed, the overrides, Hydra's config, the data's sources, the SLURM job), checked against what a resumed run
continues; the tokenizer; and, at the end, the test predictions, results.json and the console's last line."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lightbert.cluster.environment import is_global_zero
from lightbert.distributed import gather_dict
from lightbert.errors import UserError
from lightbert.files import RESULTS_FILE, write_atomically
from lightbert.run.run_dir import DATA_RECORD, LAST_CHECKPOINT, RECORD_DIR, SLURM_RECORD
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule

log = logging.getLogger(__name__)


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


def record_slurm_job(output_dir: Path) -> None:
    """The SLURM job a new run was started by, which `requeued` recognises when SLURM starts the job again."""
    if os.environ.get("SLURM_JOB_ID") and is_global_zero():
        write_atomically(output_dir / SLURM_RECORD, json.dumps({"job_id": os.environ["SLURM_JOB_ID"]}) + "\n")


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


def write_test_predictions(trainer, module, datamodule, output_dir: Path) -> list[str]:
    """Predict the task's prediction splits with the best checkpoint and write their files, as the DataModule
    declares (`predict_splits`, `prediction_writer`; pre-training and SWAG declare none). Returns the files.

    Each prediction is one example's row of the batch's "prediction" (a class, a score, or a QA window's logits),
    as a numpy array so that gathering from other devices pickles just that row.
    """
    if not isinstance(datamodule, FineTuningDataModule):
        return []  # pre-training predicts nothing after training
    splits = datamodule.predict_splits
    if not splits or datamodule.prediction_writer() is None:
        return []
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.monitor), None)
    ckpt_path = checkpoint.best_model_path if checkpoint is not None and checkpoint.best_model_path else None
    batches = trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    if len(splits) == 1:
        batches = [batches]
    predictions = {}
    for split, split_batches in zip(splits, batches, strict=True):
        by_idx = {}
        for out in split_batches:
            prediction = out["prediction"].detach().cpu()
            if prediction.is_floating_point():
                prediction = prediction.float()  # numpy has no bfloat16
            by_idx.update(zip(out["idx"].tolist(), prediction.numpy(), strict=True))
        predictions[split] = gather_dict(by_idx)  # each rank predicted its share of every split
    if trainer.global_rank != 0:
        return []
    written = datamodule.prediction_writer().write(predictions, output_dir / "predictions")
    return [str(p) for p in written]
