"""The `speed.*` switches of a run (conf/train.yaml): checked before anything is written, applied to the module once
it is built, with fp32's matmuls (the batch shapes CUDA graphs need are the
DataModule's: `run.building.fix_batch_shapes`). Each is measured by bench/pretrain_step.py (bench/RESULTS.md)."""

from __future__ import annotations

import logging

import lightning as L
import torch

from lightbert.model.fp8 import convert_to_fp8
from lightbert.model.varlen import flash_varlen_device
from lightbert.run.settings import UNPAD_SETTINGS, SpeedSettings, TrainerSettings

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


def apply_speed_switches(
    module: L.LightningModule, speed: SpeedSettings, trainer: TrainerSettings, packing: bool, training: bool = True
) -> None:
    """The switches on a built module, before Lightning moves it: fp32's matmuls, unpadding (said on the console),
    fp8, compile."""
    set_fp32_matmuls(speed, trainer)
    on_cuda = trainer.on_cuda
    flash = on_cuda and flash_varlen_device(torch.cuda.current_device())
    how, line = unpadding_for(speed.unpad, on_cuda, trainer.precision, packing, flash, trainer.strategy == "fsdp")
    log.info(line)
    module.model.bert.set_unpadding(how)  # every head holds its encoder as `bert` (Hugging Face's names)
    if speed.fp8 and training:  # before compiling, which then fuses the float8 casts
        converted = convert_to_fp8(module.model)
        log.debug(f"speed.fp8: {converted} Linear layers run their matmuls in float8 (torchao Float8Linear)")
    if speed.compile:
        module.compile_step(mode=None if speed.compile_mode == "default" else speed.compile_mode)
