"""The `speed.*` switches of a run (conf/train.yaml): checked before anything is written (`run.settings`), applied
once the DataModules and the module are built: torch's fp32 matmuls and compile caches, the batch shapes a compiled
step needs (`fix_batch_shapes`), unpadding, fp8, compile. Each is measured by bench/pretrain_step.py
(bench/RESULTS.md)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lightning as L
import torch

from lightbert.data.batches import length_buckets
from lightbert.model.fp8 import convert_to_fp8
from lightbert.model.varlen import flash_varlen_device
from lightbert.run.settings import TrainerSettings
from lightbert.run.speed_settings import UNPAD_SETTINGS, SpeedSettings

log = logging.getLogger(__name__)


def set_fp32_matmuls(speed: SpeedSettings, trainer: TrainerSettings) -> None:
    """On CUDA, fp32 matrix multiplications on TF32 tensor cores by default (`speed.matmul_precision: high`, the
    advice torch and Lightning give for Ampere and later GPUs; bf16-mixed runs most matmuls in bf16 anyway, TF32
    covers what stays fp32); the run line says it (`run_line.describe_run`). Nothing changes where no CUDA device
    runs the job."""
    if trainer.on_cuda:
        torch.set_float32_matmul_precision(speed.matmul_precision)


def unpadding_for(
    setting: bool | str, on_cuda: bool, precision: str, packing: bool, flash: bool = True, sharded: bool = False
) -> tuple[str, str]:
    """speed.unpad -> (BertModel.unpad, the console's line saying what runs, on what, and why).

    `true` picks what each device measured fastest. On a CUDA GPU, padded batches: there transformers' padded step
    beat length groups (0.59x for a fine-tuning step on an H100, no gain for pre-training at 128 tokens), whose host
    syncs also split a compiled step into pieces; packed rows keep the (T, T) mask until `pytest -m gpu` has held
    flash's variable-length kernel to it on a GPU. On a CPU, length groups (2.5-3x transformers, bench/RESULTS.md).
    `flash`: the GPU has flash's kernel (`lightbert.model.varlen.flash_varlen_device`). `sharded` (trainer=fsdp):
    padded batches in place of length groups: FSDP needs every device to run each block's gathers in step with the
    others, and an earlier FSDP2 attempt deadlocked under length groups."""
    kernel = on_cuda and flash and precision.startswith(("bf16", "16"))
    if setting is True:
        how = "off" if on_cuda else "groups"
        why = "padded on a GPU, as measured fastest there" if on_cuda else "length groups pay on a CPU"
    else:
        how, why = UNPAD_SETTINGS[setting], "as set"
    if sharded and how == "groups":
        how, why = "off", "padded under trainer=fsdp, where every device must run each block in step"
    varlen = "through flash attention's variable-length kernel"
    if not kernel:
        varlen = "one sequence at a time (the variable-length kernel needs a CUDA GPU in bf16, Ampere or later)"
    if packing:
        within = varlen if how == "varlen" else "through a (T, T) mask"
        what = f"packed rows, each example attending within itself {within}"
    else:
        attention = {"groups": "in length groups", "varlen": varlen}
        what = f"skipped, attention {attention[how]}" if how in attention else "kept"
    device = "a CUDA GPU" if on_cuda else "cpu"
    return how, f"padding: {what} (speed.unpad={str(setting).lower()} on {device}, {precision}: {why})"


# Inductor's caches (compiled FX graphs, AOTAutograd's, autotuning results, Triton's kernels) under lightbert's
# cache directory (paths.cache_dir), which outlives a job: torch's default is /tmp/torchinductor_<user>, which a
# cluster node empties between jobs, so a requeued or resumed job would compile everything again.
COMPILE_CACHE = "torch-compile"
_CACHES_SET: set[str] = set()  # the TORCHINDUCTOR_CACHE_DIR values this process set
# torch.compile's backend for speed.compile (tests set eager: Dynamo's graphs without Inductor's minutes of C++)
COMPILE_BACKEND = "inductor"


def use_compile_caches(cache_dir: str | Path | None) -> Path:
    """Points torch's compile caches at `<cache_dir>/torch-compile` before anything compiles, and turns on the
    on-disk FX graph, AOTAutograd and autotuning caches (torch's defaults, unless the environment turned them off).
    A TORCHINDUCTOR_CACHE_DIR the user set is kept. Returns the directory the caches use."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # torch writes its default into the environment once it has used it, lightbert its own: not the user's choice
    not_users = given is None or given in _CACHES_SET or Path(given) == Path(default_cache_dir()).absolute()
    if cache_dir is not None and not_users:
        ours = str(Path(cache_dir).expanduser().absolute() / COMPILE_CACHE)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = ours
        _CACHES_SET.add(ours)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    for variable, config, name in (
        ("TORCHINDUCTOR_FX_GRAPH_CACHE", inductor_config, "fx_graph_cache"),
        ("TORCHINDUCTOR_AUTOGRAD_CACHE", functorch_config, "enable_autograd_cache"),
        ("TORCHINDUCTOR_AUTOTUNE_LOCAL_CACHE", inductor_config, "autotune_local_cache"),
    ):
        if variable not in os.environ:
            setattr(config, name, True)
    return Path(inductor_cache_dir())


def fix_batch_shapes(datamodule: L.LightningDataModule, speed: SpeedSettings, compiles: bool) -> str | None:
    """Batches of a few shapes for a compiled step (`compiles`), which compiles one graph per shape. Under CUDA
    graphs (compile_mode=reduce-overhead), which record one graph per input shape: packed rows padded up to a few
    row counts (`fixed_row_counts`), other batches padded to the full max_seq_length. Otherwise unpacked batches
    are padded up to a length bucket (`length_buckets`; packed rows have one width already). Returns what the
    console says, or None where shapes are left as they are."""
    if not compiles:
        return None
    packed = getattr(datamodule, "packing", False)
    if speed.cuda_graphs(compiles):
        if packed:
            datamodule.fixed_rows = True
            return "CUDA graphs: packed row counts padded up to a few fixed ones"
        datamodule.pad_to_multiple_of = datamodule.max_seq_length
        return f"CUDA graphs: every batch padded to {datamodule.max_seq_length} tokens"
    if packed:
        return None
    buckets = length_buckets(datamodule.max_seq_length)
    datamodule.pad_to_multiple_of = buckets
    # Training and evaluation graphs of each length, and a batch of one row's: within Dynamo's limit of graphs per
    # function, past which it would run the rest eagerly.
    graphs = 2 * len(buckets) + 2
    if torch._dynamo.config.recompile_limit < graphs:
        torch._dynamo.config.recompile_limit = graphs
    lengths = ", ".join(map(str, buckets))
    return f"torch.compile: each batch padded up to {lengths} tokens, one compiled graph per length"


def what_compiles(module: L.LightningModule) -> str:
    """What `compile_step` compiles, for the console."""
    losses = " and the pre-training losses" if hasattr(module, "losses") else ""
    return f"the model ({type(module.model).__name__}){losses}"


def apply_speed_switches(
    module: L.LightningModule,
    speed: SpeedSettings,
    trainer: TrainerSettings,
    packing: bool,
    compiles: bool,
    training: bool = True,
    cache_dir: str | Path | None = None,
    datamodules: tuple[L.LightningDataModule, ...] = (),
) -> None:
    """The switches of a run: torch's own for the process first (fp32's matmuls; where the step compiles, its caches in
    `cache_dir`), then the built module's, before Lightning moves it, and its `datamodules`' batches: unpadding (said
    on the console), the batches' shapes for a compiled step (`fix_batch_shapes`, said once, for the first), fp8,
    compile when `compiles` (as the run decided it once: `run.building.step_compiles`; said on the console; how long
    it took: `plugins.callbacks.CompileTime`)."""
    set_fp32_matmuls(speed, trainer)
    caches = use_compile_caches(cache_dir) if compiles else None
    on_cuda = trainer.on_cuda
    flash = on_cuda and flash_varlen_device(torch.cuda.current_device())
    how, line = unpadding_for(speed.unpad, on_cuda, trainer.precision, packing, flash, trainer.strategy == "fsdp")
    log.info(line)
    module.model.bert.set_unpadding(how)  # every head holds its encoder as `bert` (Hugging Face's names)
    said = [fix_batch_shapes(datamodule, speed, compiles) for datamodule in datamodules]
    if said and said[0]:
        log.info(said[0])
    if speed.fp8 and training:  # before compiling, which then fuses the float8 casts
        converted = convert_to_fp8(module.model)
        log.debug(f"speed.fp8: {converted} Linear layers run their matmuls in float8 (torchao Float8Linear)")
    if compiles:
        mode = "" if speed.compile_mode == "default" else f", mode {speed.compile_mode}"
        why = "as set" if speed.compile is not None else "by default on a CUDA GPU; speed.compile=false turns it off"
        log.info(
            f"torch.compile: {what_compiles(module)}{mode}, at the first step (speed.compile="
            f"{str(speed.compile).lower() if speed.compile is not None else 'null'}: {why}); its caches in {caches}"
        )
        module.compile_step(
            mode=None if speed.compile_mode == "default" else speed.compile_mode, backend=COMPILE_BACKEND
        )
