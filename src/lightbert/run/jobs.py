"""`train(cfg)`: one experiment from a composed Hydra config. `src/train.py` calls it; so do the tests."""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from datasets.utils import logging as datasets_logging
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from omegaconf import DictConfig, OmegaConf, open_dict

from lightbert.data.local_files import file_identity
from lightbert.data.tokenizer import load_tokenizer
from lightbert.distributed import gather_dict, runs_on_cuda
from lightbert.errors import ConfigError, UserError
from lightbert.finetuning.datamodule import FineTuningDataModule
from lightbert.heads import Head, HeadArguments, head_of_module
from lightbert.inference.finetuned import carry_head, head_of
from lightbert.interop.hf import Pretrained, load_into, load_pretrained
from lightbert.model import BertConfig
from lightbert.model.config import REGULARISATION_FIELDS, SIZE_FIELDS
from lightbert.model.fp8 import check_fp8_device
from lightbert.pretraining.corpus import TextCorpus
from lightbert.run import processes
from lightbert.run.agreement import SameResumeOnEveryNode
from lightbert.run.callbacks import RunProgressBar
from lightbert.run.checkpointing import AtomicCheckpointIO, LatestCheckpoint, ResumableRNG, saved_job_shape
from lightbert.run.cli import CONF_DIR
from lightbert.run.config_checks import check_config
from lightbert.run.console import RunLogFile, tidy_lightning_console
from lightbert.run.instantiation import instantiate_config, parameters_named_by
from lightbert.run.loggers import RunCSVLogger, finish_wandb, summarise_in_wandb
from lightbert.run.phases import phases as recipe_phases
from lightbert.run.run_dir import (
    LAST_CHECKPOINT,
    check_data_unchanged,
    check_output_dir,
    checkpoint_step,
    locked,
    record_run,
    refused_leaves_nothing,
    remove_stale_temporaries,
    requeued,
    save_tokenizer,
    write_results,
)
from lightbert.run.run_dir import results as run_results
from lightbert.run.speed import apply_speed_switches, compile_mode, fix_batch_shapes, unpad_setting

log = logging.getLogger(__name__)


def _check_devices(cfg: DictConfig) -> None:
    """Refuses, before anything is written, a trainer that cannot run on this machine's devices."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    choice = HydraConfig.get().runtime.choices.get("trainer") if HydraConfig.initialized() else None
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(
            f"trainer={choice or accelerator} needs a CUDA GPU and none is visible here; use trainer=cpu, or check "
            "the command on CPU first with trainer.accelerator=cpu trainer.devices=2 trainer.max_steps=3"
        )


MATMUL_PRECISIONS = {"highest": "full fp32 matmuls", "high": "TF32 matmuls", "medium": "bf16 matmuls for fp32"}


def _set_fp32_matmuls(cfg: DictConfig) -> str | None:
    """On CUDA, fp32 matrix multiplications on TF32 tensor cores by default (`speed.matmul_precision: high`, the
    advice torch and Lightning give for Ampere and later GPUs; bf16-mixed runs most matmuls in bf16 anyway, TF32
    covers what stays fp32). Returns what the run line says, or None where no CUDA device runs the job."""
    precision = str((cfg.get("speed") or {}).get("matmul_precision", "high"))
    if precision not in MATMUL_PRECISIONS:
        raise ConfigError(f"speed.matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}, got {precision}")
    if not runs_on_cuda(str(cfg.trainer.get("accelerator", "auto"))):
        return None
    torch.set_float32_matmul_precision(precision)
    return MATMUL_PRECISIONS[precision]


def _checked_model_config(cfg: DictConfig, pretrained: Pretrained | None) -> dict:
    """The architecture as a plain dict, validated before any data work so a bad size fails at once.

    With init_from the checkpoint decides the sizes; a `model=` asking for other sizes is an error rather than
    a silent choice. Dropout set on the command line still applies (it does not change the weights).
    """
    model = OmegaConf.to_container(cfg.model, resolve=True)
    if pretrained is not None:
        # The command line's model=... / model.x=... overrides (cfg.overrides: the command line).
        explicit = [o for o in cfg.get("overrides") or [] if o.lstrip("+~").startswith(("model=", "model."))]
        if explicit:
            # model=<size> asks for every size; model.<key>=... for that key only.
            keys = [o.lstrip("+~").split("=", 1)[0] for o in explicit]
            asked = SIZE_FIELDS if "model" in keys else [k.removeprefix("model.") for k in keys]
            differ = [f for f in SIZE_FIELDS if f in asked and f in model and model[f] != pretrained.config[f]]
            if differ:
                sizes = ", ".join(f"{f} {pretrained.config[f]} (asked {model[f]})" for f in differ)
                raise ConfigError(
                    f"init_from={cfg.init_from} has other sizes than {' '.join(explicit)} asks for: {sizes}. "
                    "The checkpoint sets the architecture: drop the model override"
                )
            model = {**pretrained.config, **{f: model[f] for f in REGULARISATION_FIELDS if f in model}}
        else:
            model = dict(pretrained.config)
    config = BertConfig.from_dict({k: v for k, v in model.items() if k != "vocab_size"})
    lengths = {"task.max_seq_length": OmegaConf.select(cfg, "task.max_seq_length", default=None)}
    for number, phase in enumerate(OmegaConf.select(cfg, "task.phases", default=None) or []):
        lengths[f"task.phases[{number}].datamodule.max_seq_length"] = phase.datamodule.get("max_seq_length")
    for key, max_seq_length in lengths.items():
        if max_seq_length and max_seq_length > config.max_position_embeddings:
            raise ConfigError(
                f"{key} ({max_seq_length}) exceeds model.max_position_embeddings "
                f"({config.max_position_embeddings}); shorten the sequences or raise max_position_embeddings"
            )
    _check_token_types(cfg, config.type_vocab_size, pretrained)
    return model


def _check_token_types(cfg: DictConfig, type_vocab_size: int, pretrained: Pretrained | None) -> None:
    """A model with fewer segment embeddings than the task's inputs use would fail at its first batch (an index
    out of range in the token-type embedding): said before anything is written instead."""
    from hydra.utils import get_class

    segments = get_class(str(cfg.task.datamodule._target_)).token_types(cfg.task.datamodule)
    if type_vocab_size >= segments:
        return
    has = f"init_from={cfg.init_from} has" if pretrained is not None else "model.type_vocab_size is"
    raise ConfigError(
        f"{has} type_vocab_size {type_vocab_size}, and task={_task_option()} feeds {segments} segments (a sentence "
        f"pair); fine-tune it on a single-sentence task (glue/sst2, glue/cola, conll2003) or start from a model with "
        f"type_vocab_size {segments}"
    )


def compose_config(
    overrides: list[str], output_dir: str | Path, conf_dir: Path = CONF_DIR, config_name: str = "train"
) -> DictConfig:
    """The config `python src/train.py OVERRIDES` would run (`config_name="evaluate"`: src/evaluate.py's), with its
    run directory at `output_dir`.

    For notebooks and tests: `train(compose_config([...], dir))` is a run without the command line.
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.paths.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)  # so ${hydra:...} interpolations resolve outside a Hydra run
    with open_dict(cfg):
        del cfg["hydra"]  # as in a real run: the task function never sees Hydra's own node
    return cfg


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and validate as `cfg` says; write `results.json` in the run directory and return its content.

    The run directory is the user's record: it is held for this run alone (`locked`), and a command refused by
    the checks before training writes nothing into it.
    """
    check_config(cfg)  # before anything is read or written
    output_dir = Path(cfg.paths.output_dir)
    processes.install()  # its DataLoader workers and data-preparation pool die with it, and hold no lock
    with locked(output_dir), refused_leaves_nothing(output_dir), processes.ddp_children_of_this_job():
        return _train(cfg, output_dir)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Score the fine-tuned model `init_from` names on the task's validation splits and write the prediction files a
    training run writes, into a new run directory (`results.json` there); the checkpoint's own is never touched."""
    check_config(cfg)
    output_dir = Path(cfg.paths.output_dir)
    processes.install()
    with locked(output_dir), refused_leaves_nothing(output_dir), processes.ddp_children_of_this_job():
        return _evaluate(cfg, output_dir)


def _prepare(
    cfg: DictConfig,
    output_dir: Path,
    resume_from: Path | None,
    resumed_step: int | None = None,
    check: Callable[[Pretrained], None] | None = None,
    evaluation: bool = False,
) -> tuple[Pretrained | None, dict]:
    """What every run does before its record is written: the checks that refuse a command (devices, init_from and
    `check` of it, sizes), then `.hydra/` and train.log. Returns the checkpoint init_from names and the architecture."""
    # The run directory holds .hydra/ when the CSV logger starts writing there: not a problem.
    warnings.filterwarnings("ignore", message=".*exists and is not empty.*")
    warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*")  # Lightning internals vs newer torch
    # DDP's gradient hooks run on the default stream and torch notes at the first backward that AccumulateGrad's
    # stream differs (seen on an H100): nothing a user can change, and no synchronisation DDP does not do anyway.
    warnings.filterwarnings("ignore", message=".*AccumulateGrad node's stream.*")
    # Loader workers are lightbert's choice, said on the console (task.datamodule.num_workers=auto): Lightning's
    # advice to raise them, on every run of a many-core machine, is not the user's to act on.
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    # A short epoch logs once per epoch instead (callbacks.ShortEpochLogging): nothing left for the user to do.
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
    # The feature-based tasks keep their frozen encoder in eval mode on purpose (no dropout in the features).
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode at the start of training.*")
    _check_devices(cfg)
    _check_derived_accumulation(cfg, _batches(cfg)[1])  # a global batch the devices cannot make: refused here
    matmuls = _set_fp32_matmuls(cfg)
    compile_mode(cfg.get("speed") or {})  # a bad one is refused before anything is written
    unpad_setting(cfg.get("speed") or {})
    if (cfg.get("speed") or {}).get("fp8", False) and not evaluation:  # evaluation runs no fp8: it trains nothing
        check_fp8_device(str(cfg.trainer.get("accelerator", "auto")))
    tidy_lightning_console()
    datasets_logging.disable_progress_bar()  # on only around maps worth watching (data.local_files.progress_bars_for)
    # Set before any DataLoader or datasets.map worker forks, so the Rust tokenizer never deadlocks in one.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    L.seed_everything(cfg.seed, workers=True)
    init_from = cfg.get("init_from")
    pretrained = load_pretrained(str(init_from)) if init_from else None
    if pretrained is not None and pretrained.tokenizer is None and not cfg.task.datamodule.get("tokenizer_path"):
        raise UserError(
            f"init_from={init_from} comes without its tokenizer (tokenizer.json or vocab.txt beside the weights); "
            "copy the tokenizer it was trained with there, or give it with task.datamodule.tokenizer_path=..."
        )
    if check is not None and pretrained is not None:
        check(pretrained)
    model_config = _checked_model_config(cfg, pretrained)
    if pretrained is not None:
        _name_checkpoint_model(cfg, model_config)
    resized = _resized(cfg, resume_from, resumed_step) if resume_from is not None else False
    # A resume that changes a setting is refused here (the devices and nodes may change where the global batch stays).
    record_run(cfg, output_dir, resuming=resume_from is not None, resized=resized)
    check_data_unchanged(output_dir, data_sources(cfg), resuming=resume_from is not None)  # or its data: here
    RunLogFile.start()  # train.log from here on, with what was logged while the checks ran
    remove_stale_temporaries(output_dir)
    log.info(_describe_run(cfg, model_config, resume_from, resumed_step, evaluation=evaluation, matmuls=matmuls))
    return pretrained, model_config


def _resized(cfg: DictConfig, resume_from: Path, resumed_step: int | None) -> bool:
    """Whether a resume runs on another number of devices with the checkpoint's global batch: the data continues
    exactly (its position is the step, each step the same examples), said once. Another global batch would re-train
    or skip examples: refused with the key that keeps it. A checkpoint from before lightbert recorded its job's
    shape resumes only as it was recorded."""
    shape = saved_job_shape(resume_from)
    if not shape or shape.get("global_batch") is None:
        return False
    devices, accumulate, global_batch = _batches(cfg)
    world = devices * int(cfg.trainer.num_nodes)
    then = f"{shape['batch_size']} per device x {shape['world_size']} device(s) x {shape['accumulate']} accumulated"
    now = f"{cfg.task.batch_size} per device x {world} device(s) x {accumulate} accumulated"
    if global_batch != shape["global_batch"]:
        raise ConfigError(
            f"{resume_from} was trained with {shape['global_batch']} sequences per step ({then}), and this job makes "
            f"{global_batch} ({now}): resumed so, it would train some examples twice or skip some. Keep the global "
            f"batch with task.global_batch_size={shape['global_batch']} (the accumulation adapts), or start a new "
            "run from its weights with init_from=..."
        )
    if world != shape["world_size"]:
        log.info(
            f"resuming on {world} device(s), the checkpoint's job had {shape['world_size']}: the global batch stays "
            f"{global_batch} ({now}), and the data continues at step {resumed_step}"
        )
    return world != shape["world_size"] or accumulate != shape["accumulate"]


def _data_and_module(
    cfg: DictConfig, pretrained: Pretrained | None, model_config: dict, tokenizer_kwargs: dict, training: bool = True
):
    """The task's DataModule and LightningModule, the module holding init_from's weights; and the fresh ones."""
    # Partial, then called: objects passed through instantiate() would be turned into configs.
    with parameters_named_by(cfg.task.datamodule):
        datamodule = instantiate_config(cfg.task.datamodule, _partial_=True)(**tokenizer_kwargs)
        tokenizer = datamodule.tokenizer
    shapes = fix_batch_shapes(datamodule, cfg.get("speed") or {})
    if shapes:
        log.info(shapes)
    module = instantiate_config(
        cfg.task.module,
        model=_with_vocabulary(model_config, tokenizer, pretrained),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        _convert_="all",
    )
    fresh = _load_pretrained_weights(cfg, module, pretrained) if pretrained is not None else []
    packing = bool(cfg.task.datamodule.get("packing", False))
    apply_speed_switches(module, cfg.get("speed") or {}, cfg.trainer, packing, training)
    return datamodule, module, fresh


def _wanted_head(cfg: DictConfig) -> tuple[Head, HeadArguments] | None:
    """The fine-tuned head the task trains, and what it is built with (its labels); None for pre-training."""
    from hydra.utils import get_class

    head = head_of_module(get_class(str(cfg.task.module._target_)))
    if head is None:
        return None
    return head, head.arguments(OmegaConf.to_container(cfg.task.module, resolve=True))


def _load_pretrained_weights(cfg: DictConfig, module: L.LightningModule, pretrained: Pretrained) -> list[str]:
    """init_from's weights into the task's model: the encoder, and its fine-tuned head where that head means what
    the task's does (one console line says whether it was carried, how its labels matched, or why not)."""
    wanted = _wanted_head(cfg)
    if wanted is None:
        return load_into(module.model, pretrained)
    carry = carry_head(pretrained, *wanted)
    log.info(carry.line)
    return load_into(module.model, pretrained, carry)


def _loggers(cfg: DictConfig, resumed_step: int | None = None) -> list:
    loggers = [instantiate_config(c) for c in (cfg.get("logger") or {}).values()]
    for logger in loggers:  # the resolved config, and the command line that made it
        if isinstance(logger, RunCSVLogger) and resumed_step is not None:
            logger.resumed_step = resumed_step  # metrics.csv continues from the checkpoint's step
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    return loggers


def _train(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    started = time.time()
    again = requeued(output_dir)
    resume_from = check_output_dir(output_dir, bool(cfg.get("resume", False)) or again)
    # First on the console (train.log holds it until the checks below pass).
    log.info(f"run directory: {output_dir}")
    if again:
        restarts = os.environ["SLURM_RESTART_COUNT"]
        log.info(f"SLURM job {os.environ['SLURM_JOB_ID']} was requeued ({restarts} restart(s)): continuing its run")
    if (cfg.get("resume") or again) and resume_from is None:
        kept = _metric_rows(output_dir / "metrics.csv")
        also = f"; metrics.csv keeps the {kept} row(s) of the earlier attempt and continues after them" if kept else ""
        log.info(f"resume=true and no {output_dir / LAST_CHECKPOINT} yet: starting from the beginning{also}")
    done = checkpoint_step(resume_from) if resume_from else 0  # the step it resumes from
    pretrained, model_config = _prepare(cfg, output_dir, resume_from, done)
    try:
        tokenizer_kwargs = {"tokenizer": pretrained.tokenizer} if pretrained and pretrained.tokenizer else {}
        if resume_from is not None and (output_dir / "tokenizer.json").is_file():
            # The run's own tokenizer: the ids its checkpoint was trained on, whatever the corpus now holds.
            tokenizer_kwargs = {"tokenizer": load_tokenizer(output_dir / "tokenizer.json")}
        datamodule, module, _ = _data_and_module(cfg, pretrained, model_config, tokenizer_kwargs)
        tokenizer = datamodule.tokenizer
        # metrics.csv continues from the checkpoint's step, or after every row of an attempt that left no checkpoint
        keep_rows_before = done if resume_from is not None else (math.inf if cfg.get("resume") or again else None)
        loggers = _loggers(cfg, keep_rows_before)
        if resume_from is None:
            save_tokenizer(tokenizer, output_dir)
        phases = recipe_phases(cfg)
        for number, phase in enumerate(phases, start=1):
            if len(phases) > 1:
                if phase.end_step <= done and number < len(phases):
                    continue  # finished before the checkpoint this run resumes from
                steps = f"steps {phase.first_step}-{phase.end_step}"
                log.info(f"phase {number}/{len(phases)}: {steps}, {phase.datamodule}")
                phase_kwargs = {"tokenizer": tokenizer, "first_step": phase.first_step}
                with parameters_named_by(cfg.task.datamodule):
                    datamodule = instantiate_config(cfg.task.datamodule, **phase.datamodule, _partial_=True)(
                        **phase_kwargs
                    )
                fix_batch_shapes(datamodule, cfg.get("speed") or {})
            # Fresh callbacks for each phase: their state comes back from the checkpoint the phase starts from.
            callbacks = [instantiate_config(c) for c in (cfg.get("callbacks") or {}).values()]
            callbacks.append(SameResumeOnEveryNode(output_dir, done if resume_from is not None else None))
            trainer = _trainer(cfg, callbacks, loggers, **({"max_steps": phase.end_step} if len(phases) > 1 else {}))
            with processes.naming_killed_ranks(trainer):
                trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
            resume_from = output_dir / LAST_CHECKPOINT  # the next phase starts from this one's weights and optimizer
        results = run_results(trainer, output_dir, time.time() - started)
        results["predictions"] = _write_test_predictions(trainer, module, datamodule, output_dir)
        return _finish(trainer, results, output_dir)
    finally:
        finish_wandb()


def data_sources(cfg: DictConfig) -> dict[str, Any]:
    """What the run's data is read from, each with its identity (lightbert.data.local_files.file_identity): the
    fine-tuning files, or the pre-training corpus's files (its fingerprint for the hub's or the demo)."""
    files = OmegaConf.select(cfg, "task.data_files", default=None)
    if files is not None:
        given = {split: Path(str(path)).expanduser() for split, path in files.items() if path}
        if not given:
            return {"task.datamodule.hub_dataset": OmegaConf.select(cfg, "task.datamodule.hub_dataset", default=None)}
        return {f"task.data_files.{s}": file_identity(p) if p.is_file() else str(p) for s, p in given.items()}
    if cfg.get("corpus") is None:
        return {}
    corpus = instantiate_config(cfg.corpus)
    if isinstance(corpus, TextCorpus):
        return {str(path): file_identity(path) for path in corpus.paths}
    return {"corpus": corpus.fingerprint}


def _metric_rows(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(newline="") as file:
        return max(0, sum(1 for _ in file) - 1)


def _finish(trainer: L.Trainer, results: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """results.json and the console's last line, the W&B summary, and the end of the process group."""
    write_results(results, output_dir)
    summarise_in_wandb(trainer, results)
    _end_distributed()
    return results


def _devices(cfg: DictConfig) -> int:
    """The devices per node the trainer will use (`-1` and `auto` resolved as Lightning resolves them)."""
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    devices, accelerator = cfg.trainer.get("devices", "auto"), str(cfg.trainer.get("accelerator", "auto"))
    if runs_on_cuda(accelerator):
        return len(CUDAAccelerator.parse_devices(devices) or [])
    if devices in ("auto", -1, "-1"):
        return 1  # Lightning's CPU accelerator: one process
    return int(CPUAccelerator.parse_devices(devices))


def _batches(cfg: DictConfig) -> tuple[int, int, int]:
    """(devices per node, batches accumulated per optimizer step, the global batch): the global batch is
    task.batch_size x devices x nodes x accumulation, and `task.global_batch_size` keeps it whatever the devices and
    nodes by deriving the accumulation (a resize of the job, a requeue onto other nodes)."""
    devices, nodes, per_device = _devices(cfg), int(cfg.trainer.num_nodes), int(cfg.task.batch_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches", 1))
    wanted = OmegaConf.select(cfg, "task.global_batch_size", default=None)
    if wanted is None:
        return devices, accumulate, per_device * devices * nodes * accumulate
    one_pass = per_device * devices * nodes
    if wanted % one_pass:
        raise ConfigError(
            f"task.global_batch_size={wanted} is not a multiple of task.batch_size ({per_device}) x {devices} "
            f"device(s) x {nodes} node(s) = {one_pass}; set task.batch_size so that it divides, or another "
            "task.global_batch_size"
        )
    if accumulate != 1 and accumulate != wanted // one_pass:
        raise ConfigError(
            f"task.global_batch_size={wanted} sets the accumulation ({wanted // one_pass} on {devices} device(s) x "
            f"{nodes} node(s)), and trainer.accumulate_grad_batches={accumulate} asks for another; set one of the two"
        )
    return devices, wanted // one_pass, wanted


def _check_derived_accumulation(cfg: DictConfig, accumulate: int) -> None:
    """What cannot accumulate (config_checks refuses it for trainer.accumulate_grad_batches) is refused too where
    task.global_batch_size derives the accumulation."""
    if accumulate == 1 or OmegaConf.select(cfg, "task.global_batch_size", default=None) is None:
        return
    speed = cfg.get("speed") or {}
    cannot = "trainer.precision=bf16-true (bf16 gradients)" if str(cfg.trainer.precision) == "bf16-true" else None
    if speed.get("compile", False) and speed.get("compile_mode") == "reduce-overhead":
        cannot = "speed.compile_mode=reduce-overhead (CUDA graphs)"
    if cannot:
        raise ConfigError(
            f"task.global_batch_size={cfg.task.global_batch_size} needs {accumulate} accumulated batches per step on "
            f"these devices, and {cannot} cannot accumulate; raise task.batch_size so that one pass makes the global "
            "batch, or unset task.global_batch_size"
        )


def _trainer(cfg: DictConfig, callbacks: list, loggers: list, **overrides: Any) -> L.Trainer:
    if cfg.trainer.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks = [*callbacks, RunProgressBar()]  # lightbert's bar, not Lightning's default (Rich where installed)
    overrides.setdefault("accumulate_grad_batches", _batches(cfg)[1])
    return instantiate_config(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[AtomicCheckpointIO(), *[instantiate_config(p) for p in cfg.trainer.get("plugins") or []]],
        **overrides,
    )


# What evaluation runs without: it saves no checkpoint and trains no step.
TRAINING_ONLY_CALLBACKS = (ModelCheckpoint, LatestCheckpoint, ResumableRNG, LearningRateMonitor)


def _evaluate(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    started = time.time()
    init_from = cfg.get("init_from")
    if not init_from:
        raise ConfigError("src/evaluate.py scores a fine-tuned model: set init_from=<run directory | .ckpt | HF dir>")
    check_output_dir(output_dir, resume=False)
    log.info(f"run directory: {output_dir}")
    pretrained, model_config = _prepare(cfg, output_dir, None, check=lambda p: _check_head(cfg, p), evaluation=True)
    try:
        kwargs = {"tokenizer": pretrained.tokenizer} if pretrained.tokenizer else {}
        if OmegaConf.select(cfg, "task.data_files") is not None:  # fine-tuning data: no training split needed
            kwargs["fit"] = False
        datamodule, module, fresh = _data_and_module(cfg, pretrained, model_config, kwargs, training=False)
        if fresh:
            raise UserError(
                f"init_from={init_from} has no fine-tuned {cfg.task.name} head: {', '.join(fresh[:3])} would be "
                f"untrained. Evaluate a model fine-tuned for task={_task_option()} (its run directory or .ckpt)"
            )
        trained_for = pretrained.hyper_parameters.get("task")
        if trained_for and trained_for != cfg.task.name:
            log.warning(f"init_from={init_from} was fine-tuned on {trained_for}, and is evaluated on {cfg.task.name}")
        callbacks = [instantiate_config(c) for c in (cfg.get("callbacks") or {}).values()]
        callbacks = [c for c in callbacks if not isinstance(c, TRAINING_ONLY_CALLBACKS)]
        trainer = _trainer(cfg, callbacks, _loggers(cfg))
        trainer.validate(module, datamodule=datamodule)
        results = {
            "evaluated": pretrained.source,
            "metrics": {name: float(value) for name, value in sorted(trainer.callback_metrics.items())},
            "predictions": _write_test_predictions(trainer, module, datamodule, output_dir),
            "output_dir": str(output_dir),
            "seconds": round(time.time() - started, 1),
        }
        return _finish(trainer, results, output_dir)
    finally:
        finish_wandb()


def _check_head(cfg: DictConfig, pretrained: Pretrained) -> None:
    """Refuses, before anything is written, a checkpoint whose head is not the task's, or whose labels are not the
    task's: evaluating it would score a head that starts untrained, or name its predictions wrongly."""

    wanted = _wanted_head(cfg)
    if wanted is None:
        return  # pre-training is evaluated on its own heads; the fresh-weights check after loading still holds
    head, arguments = wanted
    found = head_of(pretrained)
    if found is not None and found[0] == head.name:
        if carry_head(pretrained, head, arguments).carry:
            return
        if head.labelled:
            raise UserError(
                f"init_from={cfg.init_from} is a {head.name.replace('_', ' ')} model with the labels "
                f"{list(found[1].labels)}, and task={_task_option()} evaluates the labels {list(arguments.labels)}; "
                "evaluate a model fine-tuned on this label set (its names may be in any order)"
            )
    what = f"a {found[0].replace('_', ' ')} model" if found else "a pre-trained model without a fine-tuned head"
    raise UserError(
        f"init_from={cfg.init_from} is {what}, and task={_task_option()} evaluates a "
        f"{head.name.replace('_', ' ')} head of its own; evaluate a model fine-tuned for this task (its "
        "run directory or .ckpt)"
    )


def _task_option() -> str:
    choice = HydraConfig.get().runtime.choices.get("task") if HydraConfig.initialized() else None
    return choice or "..."


def _end_distributed() -> None:
    """Ends the process group Lightning's DDP started, once every process has finished (a failed run leaves it to
    the exit, as a barrier could wait for a process that is gone). Left to the interpreter's exit, gloo's threads
    were seen to abort a finished DDP run ("terminate called without an active exception", exit -6)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no process leaves while another still gathers predictions
        torch.distributed.destroy_process_group()


DEFAULT_MODEL_NAME = "${hydra:runtime.choices.model}"


def size_name(model: dict, conf_dir: Path = CONF_DIR) -> str:
    """The conf/model/ size with these sizes (e.g. bert_base), else L<layers>-H<hidden>-A<heads>."""
    for path in sorted((conf_dir / "model").glob("*.yaml")):
        sizes = OmegaConf.to_container(OmegaConf.load(path))
        if all(model.get(field) == sizes.get(field) for field in SIZE_FIELDS if field in sizes):
            return path.stem
    return f"L{model['num_hidden_layers']}-H{model['hidden_size']}-A{model['num_attention_heads']}"


def _name_checkpoint_model(cfg: DictConfig, model: dict) -> None:
    """Under init_from the checkpoint decides the model: the config, the run's name and its W&B tags say the model
    that runs, not the `model=` default (a fine-tune of a bert_tiny checkpoint is not "sst2-bert_mini")."""
    name = size_name(model)
    raw = OmegaConf.to_container(cfg, resolve=False)
    with open_dict(cfg):
        cfg.model = {k: v for k, v in model.items() if k != "vocab_size"}
        if raw.get("run_name") == "${task.name}-" + DEFAULT_MODEL_NAME:
            cfg.run_name = f"{cfg.task.name}-{name}"
        wandb = (raw.get("logger") or {}).get("wandb") or {}
        if DEFAULT_MODEL_NAME in (wandb.get("tags") or []):
            cfg.logger.wandb.tags = [name if t == DEFAULT_MODEL_NAME else t for t in wandb["tags"]]


def _describe_run(
    cfg: DictConfig,
    model: dict,
    resume_from: Path | None = None,
    resumed_step: int | None = None,
    evaluation: bool = False,
    matmuls: str | None = None,
) -> str:
    """One line: what is trained on what data, where, how long."""
    sizes = f"L{model['num_hidden_layers']}/H{model['hidden_size']}/A{model['num_attention_heads']}"
    source = f"init_from={cfg.init_from}" if cfg.get("init_from") else "from scratch"
    if resume_from is not None:
        source = f"resumed from step {resumed_step} of {resume_from}"
    if cfg.task.name == "pretrain":
        corpus = cfg.get("corpus") or {}
        data = f"corpus {corpus.get('name') or ','.join(corpus.get('paths') or []) or 'demo'}"
    else:
        files = {k: v for k, v in (cfg.task.get("data_files") or {}).items() if v}
        data = ", ".join(f"{k}={v}" for k, v in files.items()) if files else "the hub's data"
    trainer = cfg.trainer
    per_node, accumulate, global_batch = _batches(cfg)
    devices = f"{per_node} x {trainer.accelerator}" + (f" x {trainer.num_nodes} nodes" if trainer.num_nodes > 1 else "")
    strategy = trainer.strategy if isinstance(trainer.strategy, str) else "fsdp (FSDP2, fully_shard)"
    steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
    epochs = trainer.get("max_epochs")
    epochs = epochs if epochs is not None and epochs >= 0 else None
    # Lightning stops at whichever limit comes first; a fine-tune on trainer=cpu has both (3 epochs, 200 steps).
    length = " or ".join([f"{epochs} epochs"] * (epochs is not None) + [f"{steps} steps"] * (steps is not None))
    if evaluation:  # src/evaluate.py trains nothing
        length = "evaluation only"
    precision = f"{trainer.precision}" + (f" ({matmuls})" if matmuls else "")
    if str(trainer.precision) in ("bf16-true", "16-true") and not evaluation:
        precision += " (fp32 master weights)"  # lightbert.optim.MasterWeights
    if (cfg.get("speed") or {}).get("fp8", False) and not evaluation:
        precision += ", fp8 matmuls" + (" (emulated on CPU: slower than fp32)" if matmuls is None else "")
    return (
        f"{cfg.task.name}: {sizes} ({source}) on {data}; {devices}, strategy {strategy}, {precision}, "
        f"{length}, batch {cfg.task.batch_size} per device"
        + (f" x {accumulate} accumulated" if accumulate > 1 else "")
        + f" = {global_batch} per step"
    )


def _with_vocabulary(model_config: dict, tokenizer, pretrained: Pretrained | None) -> dict:
    """The size files leave the vocabulary to the tokenizer; a checkpoint brings its own embedding size."""
    if pretrained is None:
        return {**model_config, "vocab_size": tokenizer.vocab_size, "pad_token_id": tokenizer.pad_id}
    if tokenizer.vocab_size > model_config["vocab_size"]:
        raise UserError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but init_from={pretrained.source} embeds only "
            f"{model_config['vocab_size']}; use the tokenizer that came with the checkpoint"
        )
    return model_config


def _write_test_predictions(trainer: L.Trainer, module, datamodule, output_dir: Path) -> list[str]:
    """Predict the task's prediction splits with the best checkpoint and write their files, as the DataModule
    declares (`predict_splits`, `prediction_writer`; pre-training and SWAG declare none).

    Each prediction is one example's row of the batch's "prediction" (a class, a score, or a QA window's logits),
    as a numpy array so that gathering from other devices pickles just that row.
    """
    if not isinstance(datamodule, FineTuningDataModule):
        return []  # pre-training predicts nothing after training
    splits = datamodule.predict_splits
    if not splits or datamodule.prediction_writer() is None:
        return []
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
