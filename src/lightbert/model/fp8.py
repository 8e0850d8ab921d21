"""FP8 matrix multiplications for training (`speed.fp8=true`), through torchao's `Float8Linear`.

Each converted `nn.Linear` keeps its weight and bias as they were (fp32, or bf16 under `bf16-true`) and casts the
input, the weight and the output's gradient to float8 at every matmul, with one dynamic scale per tensor (torchao's
"tensorwise" recipe: e4m3 forward, e5m2 gradients). LayerNorm, softmax, attention and the losses never see fp8.
Parameter names and state dicts are unchanged, so checkpoints load into a plain model (`init_from`, `predict.py`).

What is converted: the encoder's Linear layers, the pooler and the MLM transform, whose sizes are multiples of 16
(what the FP8 kernels take). The task heads (2 or 3 outputs) and the tied MLM decoder stay as they are: too small
to gain, or tied to the embedding; so does a frozen encoder (the feature-based tasks), which trains nothing.

Float8 tensor cores exist on H100 and Ada GPUs (compute capability 8.9 and later). On a CPU torchao emulates the
kernels, slower than fp32: that path is for tests, which replay every float8 matmul through CUDA's own shape checks
(tests/helpers/cuda_rules.py); `pytest -m gpu` runs it on a GPU.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from lightbert.errors import require_extra

MIN_CAPABILITY = (8, 9)  # float8 tensor cores: H100, Ada


def import_torchao():
    """torchao's float8 module, or the error that names the setting and the extra to install."""
    require_extra("fp8", "speed.fp8=true")
    # Quiet while importing: torch's pytree notes that torchao registers an Enum it no longer needs to (nothing a
    # user can act on), and a CPU build of torch cannot load torchao's CUDA extensions, one warning per library,
    # on a machine with no GPU to use them. On a CUDA build a failure to load them is worth seeing.
    quiet = [logging.getLogger("torch.utils._pytree")]
    if torch.version.cuda is None:
        quiet.append(logging.getLogger("torchao"))
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return float8


def fp8_convertible(module: nn.Module, name: str) -> bool:
    """An encoder-side Linear that trains (a frozen encoder's features stay as they were) and whose sizes the FP8
    kernels take (multiples of 16)."""
    return (
        type(module) is nn.Linear
        and module.weight.requires_grad
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
        and (name.startswith("bert.") or name.startswith("cls.predictions.transform"))
    )


def convert_to_fp8(model: nn.Module) -> int:
    """Swaps `model`'s convertible Linear layers for torchao's Float8Linear in place; returns how many."""
    float8 = import_torchao()
    names = [name for name, module in model.named_modules() if fp8_convertible(module, name)]
    # The weight gradient (grad_output.t() @ input) contracts over the tokens, whose count varies (unpadded batches,
    # the pooler's B rows, the MLM head's masked positions); CUDA's _scaled_mm wants multiples of 16 there, so the
    # inner dimension is zero-padded (which changes no sum). The CPU kernel would take any size.
    config = float8.Float8LinearConfig(pad_inner_dim=True)
    float8.convert_to_float8_training(model, module_filter_fn=fp8_convertible, config=config)
    return len(names)
