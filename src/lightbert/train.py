"""`train(cfg)`: one experiment from a composed Hydra config. `src/train.py` calls it; so do the tests."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from lightbert.errors import ConfigError, UserError
from lightbert.model import BertConfig

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"


def _instantiate(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, letting a `UserError` raised by the target through unwrapped."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        raise
    except MissingMandatoryValue as error:
        raise UserError(
            f"{error.full_key} is required: set it on the command line, e.g. {error.full_key}=..."
        ) from None


def _check_output_dir(output_dir: Path) -> None:
    # Nothing a user saved is ever lost: a finished run's directory is not trained into again.
    if (output_dir / RESULTS_FILE).exists():
        raise UserError(
            f"{output_dir} already holds a finished run ({RESULTS_FILE}); choose another directory "
            "with hydra.run.dir=... or leave it to the default, which is new for every run"
        )


def _check_devices(cfg: DictConfig) -> None:
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        choice = HydraConfig.get().runtime.choices.get("trainer") if HydraConfig.initialized() else None
        raise UserError(f"trainer={choice or accelerator} needs a CUDA GPU and none is visible here; use trainer=cpu")


def _checked_model_config(cfg: DictConfig) -> dict:
    """The model section as a plain dict, validated before any data work so a bad size fails at once."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    config = BertConfig.from_dict(model)
    max_seq_length = OmegaConf.select(cfg, "task.max_seq_length", default=None)
    if max_seq_length and max_seq_length > config.max_position_embeddings:
        raise ConfigError(
            f"task.max_seq_length ({max_seq_length}) exceeds model.max_position_embeddings "
            f"({config.max_position_embeddings}); shorten the sequences or raise max_position_embeddings"
        )
    return model


def _finish_wandb() -> None:
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and validate as `cfg` says; write `results.json` in the run directory and return its content."""
    started = time.time()
    # The run directory always holds Hydra's .hydra/ when the CSV logger starts writing there: not a problem.
    warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
    warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*")  # Lightning internals vs newer torch
    output_dir = Path(cfg.paths.output_dir)
    _check_output_dir(output_dir)
    _check_devices(cfg)
    # Set before any DataLoader or datasets.map worker forks, so the Rust tokenizer never deadlocks in one.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    L.seed_everything(cfg.seed, workers=True)
    model_config = _checked_model_config(cfg)
    try:
        datamodule = _instantiate(cfg.task.datamodule)
        tokenizer = datamodule.tokenizer
        module = _instantiate(
            cfg.task.module,
            # The size files leave the vocabulary to the tokenizer.
            model={**model_config, "vocab_size": tokenizer.vocab_size, "pad_token_id": tokenizer.pad_id},
            optim=OmegaConf.to_container(cfg.optim, resolve=True),
            _convert_="all",
        )
        callbacks = [_instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
        loggers = [_instantiate(c) for c in (cfg.get("logger") or {}).values()]
        trainer: L.Trainer = _instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
        for logger in trainer.loggers:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        _save_tokenizer(tokenizer, output_dir)
        trainer.fit(module, datamodule=datamodule)
        results = _results(trainer, output_dir, time.time() - started)
        _write_results(results, output_dir)
        return results
    finally:
        _finish_wandb()


@rank_zero_only
def _save_tokenizer(tokenizer, output_dir: Path) -> None:
    # Next to the checkpoints, so a run directory is enough to load the model again.
    tokenizer.save(output_dir / "tokenizer.json")


def _results(trainer: L.Trainer, output_dir: Path, seconds: float) -> dict[str, Any]:
    checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
    metrics = {name: float(value) for name, value in sorted(trainer.callback_metrics.items())}
    return {
        "metrics": metrics,
        "global_step": trainer.global_step,
        "best_checkpoint": checkpoint.best_model_path if checkpoint else None,
        "last_checkpoint": checkpoint.last_model_path if checkpoint else None,
        "tokenizer": str(output_dir / "tokenizer.json"),
        "output_dir": str(output_dir),
        "seconds": round(seconds, 1),
    }


@rank_zero_only
def _write_results(results: dict[str, Any], output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
    metrics = results["metrics"]
    shown = ", ".join(
        f"{k}={metrics[k]:.4f}" for k in ("val/loss", "val/mlm_accuracy", "val/nsp_accuracy") if k in metrics
    )
    print(
        f"lightbert: finished {results['global_step']} steps in {results['seconds']:.0f}s ({shown}). "
        f"Outputs in {output_dir}: {RESULTS_FILE}, metrics.csv, checkpoints/, tokenizer.json"
    )
