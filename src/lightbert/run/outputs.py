"""What a finished run writes into its run directory: the test predictions (from the best checkpoint), results.json
and the console's last line, which names the outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lightbert.cluster.environment import is_global_zero
from lightbert.distributed import gather_dict
from lightbert.files import RESULTS_FILE, write_atomically
from lightbert.run.console import in_train_log
from lightbert.run.run_dir import LAST_CHECKPOINT
from lightbert.tasks.finetuning.datamodule import FineTuningDataModule


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
    # The outputs the line names: results.json, written last, and those the run did leave.
    evaluated = results.get("evaluated")  # src/evaluate.py: no training, no checkpoint
    left = (
        ["metrics.csv", "predictions/"]
        if evaluated
        else ["metrics.csv", "checkpoints/", "tokenizer.json", "predictions/"]
    )
    outputs = [RESULTS_FILE, *_existing(output_dir, left)]
    recorded = finite_or_null(results)
    write_atomically(output_dir / RESULTS_FILE, json.dumps(recorded, indent=2, allow_nan=False) + "\n")
    metrics = results["metrics"]
    shown = [f"{k}={v:.4f}" for k, v in metrics.items() if k.startswith("val/")][:6]
    if evaluated:
        said(
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
    said(
        f"lightbert: finished {results['global_step']} steps in {results['seconds']:.0f}s ({', '.join(shown)}). "
        f"Outputs in {output_dir}: {', '.join(outputs)}"
    )


def said(line: str) -> None:
    """The run's last line: on the console as it is, and in train.log with the console's other lines."""
    print(line)
    in_train_log(line)


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite number as None: JSON has neither (Python's json writes NaN and Infinity,
    which strict readers refuse), and results.json is read by other tools. A monitor that was NaN at every validation
    leaves best_score inf in Lightning, written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    return value


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
