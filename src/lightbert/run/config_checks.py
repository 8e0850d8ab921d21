"""The config's numbers checked before anything runs: a value of the wrong kind or out of range is one message that
names its key, instead of a traceback from deep in Lightning or the data code (`trainer.max_steps=abc`,
`task.batch_size=0`, `trainer.accumulate_grad_batches=0`, a run with neither a step nor an epoch limit)."""

from __future__ import annotations

import math
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError

from lightbert.errors import ConfigError, ParameterError
from lightbert.pretraining.objectives import OBJECTIVES, MaskingShares

_MISSING = object()

# key -> (kind, smallest value allowed, whether null is allowed). Keys a config does not hold are skipped.
NUMBERS: dict[str, tuple[type, float, bool]] = {
    "seed": (int, 0, False),
    "trainer.max_steps": (int, -1, False),
    "trainer.max_epochs": (int, -1, True),
    "trainer.accumulate_grad_batches": (int, 1, False),
    "trainer.log_every_n_steps": (int, 1, False),
    "trainer.num_nodes": (int, 1, False),
    "trainer.gradient_clip_val": (float, 0, True),
    "trainer.val_check_interval": (float, 0, True),
    "task.batch_size": (int, 1, False),
    "task.global_batch_size": (int, 1, True),
    "task.max_seq_length": (int, 1, False),
    "task.checkpoint_every_n_steps": (int, 1, True),
    "task.cpu_val_check_interval": (int, 1, True),
    "task.datamodule.eval_batch_size": (int, 1, True),
    "task.datamodule.dupe_factor": (int, 1, False),
    "task.datamodule.max_predictions_per_seq": (int, 1, False),
    "task.datamodule.num_workers": (int, 0, False),
    "task.datamodule.vocab_size": (int, 1, False),
    "optim.lr": (float, 0, False),
    "optim.warmup_ratio": (float, 0, False),
    "optim.weight_decay": (float, 0, False),
}
POSITIVE = ("optim.lr", "trainer.val_check_interval")  # > 0, not only >= the minimum
LARGEST = {"seed": 2**32 - 1}  # numpy's and Python's seeds
# Lightning's precisions (lightning.fabric.connector._PRECISION_INPUT), here so that a refusal needs no torch.
PRECISIONS = ("16-true", "16-mixed", "bf16-true", "bf16-mixed", "32-true", "64-true", "16", "bf16", "32", "64",
              "transformer-engine", "transformer-engine-float16")  # fmt: skip
AT_MOST_ONE = ("optim.warmup_ratio",)
OR_AUTO = ("task.datamodule.num_workers",)  # "auto" or a number (fine-tuning's loaders pick by the machine)


def _value(cfg: DictConfig, key: str) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False)
    except Exception:  # an interpolation that does not resolve: left to the code that reads it
        return _MISSING


def check_config(cfg: DictConfig) -> None:
    """The checks a command is refused by before anything is read or written: numbers in range, and a fine-tuning
    task given the pre-trained model it starts from."""
    _check_whole(cfg)
    check_numbers(cfg)
    objective = OmegaConf.select(cfg, "task.objective", default=None)
    if objective is not None and objective not in OBJECTIVES:
        raise ConfigError(f"task.objective={objective!r} is not known; valid: {list(OBJECTIVES)}")
    masking = OmegaConf.select(cfg, "task.datamodule.masking", default=None)
    if masking is not None:
        try:
            MaskingShares(**masking)
        except ParameterError as error:
            raise error.naming({"masking": "task.datamodule.masking"}) from None
    fine_tuning = OmegaConf.select(cfg, "task.data_files", default=None) is not None
    if fine_tuning and not cfg.get("init_from") and not OmegaConf.select(cfg, "task.datamodule.tokenizer_path"):
        choice = HydraConfig.get().runtime.choices.get("task") if HydraConfig.initialized() else None
        raise ConfigError(
            f"task={choice or cfg.task.name} fine-tunes a pre-trained model: set init_from=<checkpoint> (a lightbert "
            ".ckpt or run directory, a Hugging Face directory, or a hub id); its tokenizer comes with it"
        )


# The parts every run reads, each with a key it cannot be without: removing one (`~trainer`) leaves nothing to run.
REQUIRED = {
    "model": "model.hidden_size",
    "task": "task.name",
    "task.datamodule": "task.datamodule._target_",
    "task.module": "task.module._target_",
    "trainer": "trainer._target_",
    "optim": "optim.lr",
    "paths": "paths.output_dir",
}


def _check_whole(cfg: DictConfig) -> None:
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except (InterpolationResolutionError, GrammarParseError) as error:
        key = getattr(error, "full_key", None) or "a value"
        reason = str(error).splitlines()[0]
        raise ConfigError(
            f"{key} cannot be resolved ({reason}); an interpolation ${{...}} there refers to itself or to a key "
            "that does not exist: give the value itself"
        ) from None
    for key, inner in REQUIRED.items():
        if OmegaConf.select(cfg, inner, default=None) is None:
            raise ConfigError(f"the config has no {key} (an override ~{key}?); every run needs it: drop that override")


def check_numbers(cfg: DictConfig) -> None:
    for key, (kind, minimum, nullable) in NUMBERS.items():
        value = _value(cfg, key)
        if value is _MISSING or (value is None and nullable) or (value == "auto" and key in OR_AUTO):
            continue
        number = _as_number(value, kind)
        what = ("an integer" if kind is int else "a number") + (" or auto" if key in OR_AUTO else "")
        if number is None:
            raise ConfigError(f"{key} must be {what}, got {value!r}")
        if number < minimum or (key in POSITIVE and number <= 0) or (key in AT_MOST_ONE and number > 1):
            bound = "> 0" if key in POSITIVE else f">= {minimum:g}" + (" and <= 1" if key in AT_MOST_ONE else "")
            raise ConfigError(f"{key} must be {bound}, got {value!r}")
        if key in LARGEST and number > LARGEST[key]:
            raise ConfigError(f"{key} must be from {minimum:g} to {LARGEST[key]}, got {value!r}")
    _check_trainer_choices(cfg)
    _check_cuda_graphs(cfg)
    steps, epochs = _value(cfg, "trainer.max_steps"), _value(cfg, "trainer.max_epochs")
    if steps == -1 and epochs in (-1, None):
        raise ConfigError(
            "trainer.max_steps=-1 and trainer.max_epochs=-1 leave the run without an end: set one of them, "
            "e.g. trainer.max_steps=1000"
        )


def _check_trainer_choices(cfg: DictConfig) -> None:
    precision = _value(cfg, "trainer.precision")
    if precision is not _MISSING and precision is not None and str(precision) not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision!r} is not a precision; valid: {', '.join(PRECISIONS)}")
    strategy = _value(cfg, "trainer.strategy")
    target = strategy.get("_target_", "") if OmegaConf.is_dict(strategy) else str(strategy)
    if str(precision) in ("bf16-true", "16-true") and "fsdp" in str(target).lower():
        # lightbert.optim.MasterWeights keeps the fp32 weights in its own state, which FSDP's sharded optimizer
        # state does not know; FSDP with bf16-mixed keeps fp32 shards and computes in bf16 already.
        raise ConfigError(
            f"trainer.precision={precision} (a bf16 model with fp32 master weights in the optimizer) does not run "
            "under trainer=fsdp; use trainer.precision=bf16-mixed with FSDP"
        )
    if str(precision) == "16-mixed" and "fsdp" in str(target).lower():
        # Lightning's ModelParallelStrategy (FSDP2) refuses it: a loss scaler would judge each device's gradient
        # shard alone, and one device could skip a step that another takes.
        raise ConfigError(
            "trainer.precision=16-mixed (fp16 with a loss scaler) does not run under trainer=fsdp; use "
            "trainer.precision=bf16-mixed (Ampere GPUs and later) or 32-true"
        )
    if str(precision) == "16-true":
        # Lightning's 16-true scales no loss: small fp16 gradients underflow to zero.
        raise ConfigError(
            "trainer.precision=16-true holds the model in fp16 with no loss scaling, and small gradients underflow "
            "to zero: use trainer.precision=16-mixed (scaled loss), or bf16-true on a GPU that has bf16"
        )
    accumulate = _value(cfg, "trainer.accumulate_grad_batches")
    if str(precision) == "bf16-true" and accumulate not in (_MISSING, None) and int(float(accumulate)) > 1:
        # The micro-batches' gradients add up in the bf16 .grad of the model (about 1% error over 128 of them).
        raise ConfigError(
            f"trainer.precision=bf16-true adds up gradients in bf16, which loses precision over "
            f"trainer.accumulate_grad_batches={accumulate}: set trainer.accumulate_grad_batches=1 (a larger "
            "task.batch_size instead) or trainer.precision=bf16-mixed"
        )
    devices = _value(cfg, "trainer.devices")
    if devices is _MISSING or devices is None or OmegaConf.is_list(devices):
        return
    text = str(devices).strip()
    counts = [part.strip() for part in text.split(",") if part.strip()]
    numbers = counts and all(part.lstrip("-").isdigit() for part in counts)
    if text == "auto" or (numbers and (len(counts) > 1 or int(counts[0]) != 0)):  # "0,1" are device indices
        return
    raise ConfigError(
        f"trainer.devices={devices!r} is not a number of devices: give a count (1, 2, ...), -1 or auto for all, or "
        "a list of device indices such as [0,1]"
    )


def _check_cuda_graphs(cfg: DictConfig) -> None:
    """speed.compile_mode=reduce-overhead records CUDA graphs, which torch cannot combine with gradient accumulation
    (a replay overwrites the gradients being accumulated: "accessing gradient tensor output of CUDAGraphs that has
    been overwritten", pytorch#169545), and which record one graph per input shape."""
    speed = _value(cfg, "speed")
    if (
        not OmegaConf.is_dict(speed)
        or not speed.get("compile", False)
        or speed.get("compile_mode") != "reduce-overhead"
    ):
        return
    accumulate = _value(cfg, "trainer.accumulate_grad_batches")
    if accumulate not in (_MISSING, None) and int(float(accumulate)) > 1:
        raise ConfigError(
            f"speed.compile_mode=reduce-overhead (CUDA graphs) cannot run with trainer.accumulate_grad_batches="
            f"{accumulate}: a graph's replay overwrites the gradients being accumulated; set "
            "trainer.accumulate_grad_batches=1 (a larger task.batch_size instead) or speed.compile_mode=default"
        )
    unpad, packing = speed.get("unpad", True), _value(cfg, "task.datamodule.packing") is True
    if unpad == "groups" or (unpad == "varlen" and not packing):
        raise ConfigError(
            f"speed.compile_mode=reduce-overhead records one CUDA graph per input shape, and speed.unpad={unpad} "
            "changes the token count every batch: use speed.unpad=true (padded on a GPU) or speed.unpad=false"
        )
    sparse = _value(cfg, "task.module.sparse_mlm_head") is True
    if _value(cfg, "task.datamodule.packing") is False and sparse and _value(cfg, "task.objective") != "ltr":
        raise ConfigError(
            "speed.compile_mode=reduce-overhead records one CUDA graph per input shape, and unpacked pre-training's "
            "MLM head runs on a number of masked tokens that changes every batch: set task.datamodule.packing=true"
        )


def _as_number(value: Any, kind: type) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if kind is int and value != int(value):
        return None
    return value
