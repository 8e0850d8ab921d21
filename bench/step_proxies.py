"""CPU proxies for a GPU pre-training step: figures a CPU computes exactly that move with the GPU's time.

    python bench/step_proxies.py                                   # bert_base, 128 tokens, batch 16
    python bench/step_proxies.py --model bert_tiny --batch-size 8 --inductor

1. FLOPs executed over useful FLOPs (`torch.utils.flop_counter.FlopCounterMode`, forward and backward of
   `PreTrainingModule._step`, real CPU tensors, one batch of the demo corpus): useful is what MFU counts
   (`step_flops`: 6N + 12·L·H·T per real token, the MLM head on predicted positions), so the ratio is the matmul work
   a layout wastes: padded rows against length groups, variable-length attention and packed rows (padding waste),
   and the MLM head on every position against the masked positions only (dense-head waste).
2. Graphs, graph breaks and recompilations of the compiled step on the GPU's default path (`unpadding_for` as a CUDA
   GPU in bf16-mixed decides it), on the meta device in bf16 with flash's variable-length kernel taken as present:
   the CUDA path's code, traced without a GPU (aot_eager). Four batches of different masks, with and without packing.
3. With --inductor: the kernels Inductor generates for the compiled step and the bytes they read and write
   (`torch._inductor.metrics`: `generated_kernel_count`, `num_bytes_accessed`), on the CPU. A GEMM is a library call,
   not a generated kernel: the count is the element-wise, normalization and reduction work, the part of a GPU step
   that fusion shrinks; the bytes are every node's reads and writes, GEMMs' included. Minutes of C++ compiling for
   anything but a tiny model.

docs/speed.md ("CPU proxies") says which of these predicted the H100's findings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pretrain_step

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.plugins.callbacks import step_flops
from lightbert.run.speed import unpadding_for
from lightbert.tasks.pretraining.module import PreTrainingModule
from lightbert.tasks.pretraining.packing import PackingCollator, pack_batch

# (case, speed.unpad's BertModel mode, packed rows, sparse MLM head)
LAYOUTS = [
    ("padded", "off", False, True),
    ("length groups", "groups", False, True),
    ("varlen", "varlen", False, True),
    ("packed", "off", True, True),
    ("packed + varlen", "varlen", True, True),
    ("padded, dense MLM head", "off", False, False),
]


def batches(datamodule, batch_size: int, seq_len: int, seed: int) -> tuple[dict, dict]:
    """A batch of the demo corpus, masked by the collator, and the same examples packed into rows of `seq_len`."""
    plain = pretrain_step.pretraining_batch(datamodule, batch_size, seed)
    collate = PackingCollator(datamodule.collator(), seq_len)
    packed = pack_batch(plain, seq_len, collate.max_examples_per_row, collate.slots, datamodule.tokenizer.pad_id)
    return plain, packed


def module_for(config, unpad: str, sparse_head: bool, seed: int = 0) -> PreTrainingModule:
    torch.manual_seed(seed)
    module = PreTrainingModule(config.to_dict(), {"lr": 1e-5, "warmup_ratio": 0.01}, sparse_mlm_head=sparse_head)
    module.model.bert.set_unpadding(unpad)
    return module


def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def cpu_attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


# The CPU's fused attention kernel, which torch's FLOP counter leaves out (it counts CUDA's): the same formulas.
CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_attention_backward,
}


def executed_flops(module: PreTrainingModule, batch: dict) -> int:
    """Matmul FLOPs (attention's included) of one forward and backward of the pre-training step, as run."""
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        module._step(batch)["loss"].backward()
    return counter.get_total_flops()


def flop_ratios(config, plain: dict, packed: dict) -> dict[str, float]:
    """Executed over useful FLOPs per layout (1.00: nothing wasted)."""
    lengths = plain["attention_mask"].sum(1)
    useful = int(step_flops(config, lengths, int((plain["labels"] != IGNORE_INDEX).sum())))
    return {
        case: executed_flops(module_for(config, unpad, sparse), packed if packing else plain) / useful
        for case, unpad, packing, sparse in LAYOUTS
    }


def gpu_default_graphs(config, batch_list: list[dict], packing: bool) -> dict[str, int | str]:
    """Graphs, breaks and recompilations of the compiled model (forward and backward) over `batch_list`, with the
    unpadding a CUDA GPU picks by default, on meta tensors in bf16 (aot_eager), flash's variable-length kernel taken
    as there. (The losses' own graph has fixed shapes: tests/test_prediction_slots.py holds it to one.)"""
    from torch._dynamo.utils import counters

    how, _ = unpadding_for(True, True, "bf16-mixed", packing)
    torch._dynamo.reset()
    counters.clear()
    module = module_for(config, how, True)
    net = module.model.to("meta", torch.bfloat16).train()
    net.compile(backend="aot_eager")
    module.model = net
    warm = None
    with mock.patch("lightbert.model.varlen.flash_varlen_supported", lambda q: q.dtype == torch.bfloat16):
        for batch in batch_list:
            mlm, nsp = module({k: v.to("meta") for k, v in batch.items()})
            (mlm.float().sum() + nsp.float().sum()).backward()
            warm = counters["stats"]["unique_graphs"] if warm is None else warm
    found = {
        "unpad": how,
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
        "recompilations": counters["stats"]["unique_graphs"] - warm,
    }
    torch._dynamo.reset()
    return found


def inductor_kernels(config, batch: dict) -> dict[str, int]:
    """Kernels Inductor generates for the compiled step (model and losses, forward and backward) and the bytes they
    read and write, on the CPU."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics

    how, _ = unpadding_for(True, True, "bf16-mixed", packing=False)
    torch._dynamo.reset()
    metrics.reset()
    module = module_for(config, how, True)
    module.compile_step()
    torch._logging.set_logs(inductor_metrics=True)  # Inductor counts the bytes only for its metrics log
    try:  # and only when it generates the code: no cached graph
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
            module._step(batch)["loss"].backward()
    finally:
        torch._logging.set_logs()
    found = {"kernels": metrics.generated_kernel_count, "bytes": int(metrics.num_bytes_accessed)}
    torch._dynamo.reset()
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_base")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--inductor", action="store_true", help="also compile with Inductor and count its kernels")
    parser.add_argument("--cache-dir", default=None, help="demo corpus cache (default: pretrain_step.py's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    flags = ["--model", args.model, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
    settings = pretrain_step.parse_args([*flags, *(["--cache-dir", args.cache_dir] if args.cache_dir else [])])
    config = pretrain_step.model_config(args.model, dropout=0.0)  # dropout changes no FLOPs; off: runs repeat
    datamodule = pretrain_step.demo_datamodule(settings)
    plain, packed = batches(datamodule, args.batch_size, args.seq_len, args.seed)
    real = plain["attention_mask"].sum() / plain["attention_mask"].numel()
    print(
        f"{args.model}, {args.batch_size} x {args.seq_len}: {100 * real:.1f}% real tokens; "
        f"{packed['input_ids'].shape[0]} packed rows"
    )
    for case, ratio in flop_ratios(config, plain, packed).items():
        print(f"FLOPs executed / useful  {case:<24} {ratio:.3f}")
    more = [batches(datamodule, args.batch_size, args.seq_len, args.seed + i) for i in range(4)]
    for packing in (False, True):
        found = gpu_default_graphs(config, [pair[packing] for pair in more], packing)
        print(
            f"compiled, GPU default ({'packed' if packing else 'not packed'}, unpad {found['unpad']}): "
            f"{found['graphs']} graphs, {found['breaks']} breaks, {found['recompilations']} recompilations"
        )
    if args.inductor:
        found = inductor_kernels(config, plain)
        print(f"inductor: {found['kernels']} generated kernels, {found['bytes'] / 1e6:.1f} MB read and written")


if __name__ == "__main__":
    main()
