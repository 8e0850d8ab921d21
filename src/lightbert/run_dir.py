"""The run directory, the user's record of a run: what may be trained into it, and what a finished run leaves."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from lightbert import RESULTS_FILE
from lightbert.errors import UserError
from lightbert.files import write_atomically

log = logging.getLogger(__name__)

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


def check_output_dir(output_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to resume from, if any. Nothing a user saved is ever lost: a finished run's directory is
    not trained into again, and an unfinished one only to continue it."""
    if (output_dir / RESULTS_FILE).exists():
        raise UserError(
            f"{output_dir} already holds a finished run ({RESULTS_FILE}); choose another directory "
            "with hydra.run.dir=... or leave it to the default, which is new for every run"
        )
    last = output_dir / LAST_CHECKPOINT
    if resume:
        if last.is_file():
            return last
        log.info(f"resume=true and no {last} yet: starting from the beginning")
    elif last.is_file():
        raise UserError(
            f"{output_dir} holds an unfinished run ({LAST_CHECKPOINT}); add resume=true to continue it, "
            "or choose another directory with hydra.run.dir=..."
        )
    return None


@rank_zero_only
def save_tokenizer(tokenizer, output_dir: Path) -> None:
    # Next to the checkpoints, so a run directory is enough to load the model again.
    tokenizer.save(output_dir / "tokenizer.json")


def results(trainer: L.Trainer, output_dir: Path, seconds: float) -> dict[str, Any]:
    """What `results.json` holds: the final metrics, the best checkpoint by the task's monitor, where things are."""
    checkpoints = [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
    checkpoint = next((c for c in checkpoints if c.monitor), None)  # the best by the task's monitor
    metrics = {name: float(value) for name, value in sorted(trainer.callback_metrics.items())}
    best = checkpoint.best_model_score if checkpoint is not None else None
    return {
        "metrics": metrics,
        "monitor": checkpoint.monitor if checkpoint else None,
        "best_score": float(best) if best is not None else None,
        "global_step": trainer.global_step,
        "best_checkpoint": (checkpoint.best_model_path or None) if checkpoint else None,  # None: no validation ran
        "last_checkpoint": str(output_dir / LAST_CHECKPOINT) if (output_dir / LAST_CHECKPOINT).is_file() else None,
        "tokenizer": str(output_dir / "tokenizer.json"),
        "output_dir": str(output_dir),
        "seconds": round(seconds, 1),
    }


@rank_zero_only
def write_results(results: dict[str, Any], output_dir: Path) -> None:
    """results.json, and one console line that says how the run ended and where its outputs are."""
    write_atomically(output_dir / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    metrics = results["metrics"]
    shown = [f"{k}={v:.4f}" for k, v in metrics.items() if k.startswith("val/")][:6]
    if results["monitor"] and results["best_score"] is not None:
        shown.append(f"best {results['monitor']}={results['best_score']:.4f}")
    if not shown:
        shown = ["no validation ran: raise trainer.max_steps or lower trainer.val_check_interval"]
    outputs = [RESULTS_FILE, "metrics.csv", "checkpoints/", "tokenizer.json"]
    if results.get("predictions"):
        outputs.append("predictions/")
    print(
        f"lightbert: finished {results['global_step']} steps in {results['seconds']:.0f}s ({', '.join(shown)}). "
        f"Outputs in {output_dir}: {', '.join(outputs)}"
    )
