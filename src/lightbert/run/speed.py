"""The `speed.*` switches of a run (conf/train.yaml): checked before anything is written, applied to the module
once it is built. Each is measured by bench/pretrain_step.py (bench/RESULTS.md)."""

from __future__ import annotations

import logging

import lightning as L
import torch
from omegaconf import DictConfig

from lightbert.distributed import runs_on_cuda
from lightbert.errors import ConfigError
from lightbert.model import BertModel
from lightbert.model.fp8 import convert_to_fp8

log = logging.getLogger(__name__)

# torch.compile's modes: reduce-overhead captures CUDA graphs (a launch-bound step, e.g. the paper's per-device
# batch), which needs fixed shapes: task.datamodule.packing=true, or speed.unpad=false with full-width padding.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# speed.unpad -> BertModel.unpad; true picks by the device (`unpadding_for`).
UNPAD_SETTINGS = {False: "off", "groups": "groups", "varlen": "varlen"}


def compile_mode(speed: DictConfig | dict) -> str:
    mode = str(speed.get("compile_mode", "default"))
    if mode not in COMPILE_MODES:
        raise ConfigError(f"speed.compile_mode={mode} is not known; valid: {', '.join(COMPILE_MODES)}")
    return mode


def unpad_setting(speed: DictConfig | dict) -> bool | str:
    setting = speed.get("unpad", True)
    if setting is not True and setting not in UNPAD_SETTINGS:
        raise ConfigError(f"speed.unpad={setting} is not known; valid: true (by the device), false, groups, varlen")
    return setting


def unpadding_for(
    setting: bool | str, on_cuda: bool, precision: str, packing: bool, ampere: bool = True
) -> tuple[str, str]:
    """speed.unpad -> (BertModel.unpad, the console's line saying what runs, and on what).

    `true` picks by what the device pays for. Packed rows on a CUDA GPU in bf16/fp16 attend through flash
    attention's variable-length kernel: no (T, T) mask, which rules out flash's own kernel (never run on a GPU here).
    Everything else keeps the path measured so far: length groups, which pay on a CPU (bench/RESULTS.md). On a GPU
    they measured 0.59x transformers for fine-tuning; `bench/pretrain_step.py --part finetune --unpad varlen`
    compares the varlen path there, and until a GPU has measured it, `true` keeps length groups."""
    # What flash's variable-length kernel takes: bf16/fp16 on a GPU of compute capability 8.0 or later (`ampere`)
    kernel = on_cuda and ampere and precision.startswith(("bf16", "16"))
    how = UNPAD_SETTINGS[setting] if setting is not True else ("varlen" if packing and kernel else "groups")
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
    return how, f"padding: {what} (speed.unpad={str(setting).lower()} on {device}, {precision})"


def apply_speed_switches(
    module: L.LightningModule,
    speed: DictConfig | dict,
    trainer: DictConfig | dict,
    packing: bool = False,
    training: bool = True,
) -> None:
    """The switches on a built module, before Lightning moves it: unpadding (said on the console), fp8, compile."""
    on_cuda = runs_on_cuda(str(trainer.get("accelerator", "auto")))
    ampere = on_cuda and torch.cuda.get_device_capability() >= (8, 0)
    how, line = unpadding_for(unpad_setting(speed), on_cuda, str(trainer.get("precision", "32")), packing, ampere)
    log.info(line)
    for submodule in module.modules():
        if isinstance(submodule, BertModel):
            submodule.unpad = how
    if speed.get("fp8", False) and training:  # before compiling, which then fuses the float8 casts
        converted = convert_to_fp8(module.model)
        log.debug(f"speed.fp8: {converted} Linear layers run their matmuls in float8 (torchao Float8Linear)")
    mode = compile_mode(speed)
    if speed.get("compile", False):
        module.compile_step(mode=None if mode == "default" else mode)
