"""speed.compile fuses the step's element-wise work, read from the code Inductor generates.

On CPU Inductor writes C++ kernels; on CUDA the same fusion decisions become Triton kernels. A kernel's name lists
the aten ops fused into it (`descriptive_names="original_aten"`), so the tests read what was fused from the names.
"""

from __future__ import annotations

import re

import torch
import torch._inductor.config as inductor_config
from test_packing import CONFIG, WIDTH, masking, sentence_pairs
from torch._inductor.utils import run_and_get_code

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.tasks.pretraining.module import PreTrainingModule, pretraining_losses
from lightbert.tasks.pretraining.packing import PackingCollator

LAYERS = 1  # each layer adds the same kernels, and seconds of C++ compiling


def kernels(code: str) -> list[str]:
    """The fused kernels of one generated module, by name (cpp_fused_<ops>_<n> on CPU, triton_<kind>_fused_... on
    CUDA)."""
    return re.findall(r"^(\w*fused\w*) = async_compile\.", code, flags=re.MULTILINE)


def fused(kernel: str, *ops: str) -> bool:
    """Whether the kernel named `kernel` computes each of the aten `ops`."""
    return all(f"_{op}_" in f"{kernel}_" for op in ops)


def generated(step) -> list[list[str]]:
    """The kernels of every module Inductor generates while `step` runs: forward graphs, then backward graphs.

    Scalar C++ (`cpp.vec_isa_ok=False`): which nodes a kernel fuses is the scheduler's decision, made before the C++
    is written, and the same with or without SIMD (measured: the same kernels, by name, for every graph here); the
    SIMD code costs g++ about twice the CPU, and a cold cache its vector-ISA probes (about 8 CPU-s) first."""
    with inductor_config.patch({"cpp.descriptive_names": "original_aten", "cpp.vec_isa_ok": False}):
        _, codes = run_and_get_code(step)
    return [kernels(code) for code in codes]


def test_the_losses_compile_to_one_kernel_each_way_and_equal_eager():
    """Cast, log-softmax, loss and arg-max over the (N, V) MLM logits, and the NSP loss: one pass forward, one
    backward, where eager runs one kernel per op; same values and gradients as eager."""
    torch.manual_seed(0)
    mlm_logits, nsp_logits = torch.randn(37, 300), torch.randn(9, 2)
    mlm_labels, nsp_labels = torch.randint(0, 300, (37,)), torch.randint(0, 2, (9,))
    mlm_labels[::4], nsp_labels[-2:] = IGNORE_INDEX, IGNORE_INDEX  # packed batches' empty slots

    def run(losses) -> tuple[dict, torch.Tensor, torch.Tensor]:
        mlm, nsp = mlm_logits.clone().requires_grad_(), nsp_logits.clone().requires_grad_()
        out = losses(mlm, mlm_labels, nsp, nsp_labels)
        out["loss"].backward()
        return out, mlm.grad, nsp.grad

    eager = run(pretraining_losses)
    compiled = torch.compile(pretraining_losses)
    [forward, backward] = generated(lambda: run(compiled))
    assert len(forward) == 1 and fused(forward[0], "_log_softmax", "nll_loss_forward", "argmax"), forward
    assert len(backward) == 1, backward
    again = run(compiled)
    for name in eager[0]:
        torch.testing.assert_close(again[0][name], eager[0][name], rtol=1e-6, atol=1e-6, msg=name)
    torch.testing.assert_close(again[1], eager[1], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(again[2], eager[2], rtol=1e-6, atol=1e-7)


def test_the_compiled_training_step_fuses_dropout_residual_layernorm_and_gelu():
    """The packed training step under `compile_step` (what speed.compile runs): each dropout + residual add +
    LayerNorm is one kernel, GELU and its gradient are fused into neighbouring kernels, and the losses are one kernel
    each way. (The GEMMs are library calls, not kernels Inductor writes.)"""
    torch.manual_seed(0)
    module = PreTrainingModule({**CONFIG.to_dict(), "num_hidden_layers": LAYERS}, {"lr": 1e-4, "warmup_ratio": 0.01})
    batch = PackingCollator(masking(), WIDTH)(sentence_pairs(16))
    module.compile_step()
    model_forward, model_backward, losses_forward, losses_backward = generated(
        lambda: module._step(batch)["loss"].backward()
    )
    residual_norms = [k for k in model_forward if fused(k, "add", "native_dropout", "native_layer_norm")]
    # The embeddings' sum, then two per layer (after attention, after the feed-forward)
    assert len(residual_norms) == 1 + 2 * LAYERS, model_forward
    assert any(fused(k, "gelu") for k in model_forward), model_forward
    assert any(fused(k, "gelu_backward") for k in model_backward), model_backward
    assert any(fused(k, "native_dropout_backward", "native_layer_norm_backward") for k in model_backward)
    assert len(losses_forward) == 1 and fused(losses_forward[0], "nll_loss_forward", "argmax"), losses_forward
    assert len(losses_backward) == 1, losses_backward
