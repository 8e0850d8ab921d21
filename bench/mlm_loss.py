"""The pre-training losses eager against compiled (what `speed.compile` runs), forward and backward, in one process.

    python bench/mlm_loss.py                                  # CPU, fp32 logits
    python bench/mlm_loss.py --device cuda --dtype bf16       # what a bf16 GPU step hands the losses

`lightbert.tasks.pretraining.module.pretraining_losses` reads the (N, V) MLM logits of the predicted positions: the cast
to fp32, log-softmax, the loss, the arg-max of the accuracy, and the NSP loss on (M, 2) logits. Eager runs one
kernel per op, each a pass over N x V values; compiled, Inductor fuses them into one pass forward and one backward
(`tests/test_compiled_step.py`). The default size is a batch of 256 sequences of 128 tokens with 20 predictions
each (15%), vocab 30522. Both sides give the same numbers before timing; calls are interleaved, medians reported.
"""

from __future__ import annotations

import argparse

import torch
from pretrain_step import time_interleaved

from lightbert.data.encoding import IGNORE_INDEX
from lightbert.tasks.pretraining.module import pretraining_losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256 * 20, help="predicted positions N (the MLM logits' rows)")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--sequences", type=int, default=256, help="NSP rows M")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the logits' dtype")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--compile-backend", default="inductor", help="torch.compile's backend (aot_eager: the graphs, no kernels)"
    )
    args = parser.parse_args()
    device, dtype = torch.device(args.device), {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    torch.manual_seed(0)
    mlm_logits = torch.randn(args.rows, args.vocab_size, device=device, dtype=dtype, requires_grad=True)
    nsp_logits = torch.randn(args.sequences, 2, device=device, dtype=dtype, requires_grad=True)
    mlm_labels = torch.randint(0, args.vocab_size, (args.rows,), device=device)
    mlm_labels[::10] = IGNORE_INDEX  # a packed batch's empty prediction slots
    nsp_labels = torch.randint(0, 2, (args.sequences,), device=device)

    def step(losses) -> dict[str, torch.Tensor]:
        mlm_logits.grad = nsp_logits.grad = None
        out = losses(mlm_logits, mlm_labels, nsp_logits, nsp_labels)
        out["loss"].backward()
        return out

    compiled = torch.compile(pretraining_losses, backend=args.compile_backend)
    eager_out, compiled_out = step(pretraining_losses), step(compiled)
    for name, value in eager_out.items():  # the same numbers before anything is timed
        torch.testing.assert_close(compiled_out[name], value, rtol=1e-4, atol=1e-4, msg=name)
    seconds = time_interleaved(
        {"eager": lambda: step(pretraining_losses), "compiled": lambda: step(compiled)},
        device, args.warmup, args.repeats,
    )  # fmt: skip
    size = f"{args.rows} x {args.vocab_size} {args.dtype} MLM logits, {args.sequences} NSP rows, {args.device}"
    print(f"pre-training losses, forward and backward: {size}")
    for name, value in seconds.items():
        print(f"  {name:8} {1e3 * value:9.2f} ms")
    print(f"compiled losses speedup vs eager: {seconds['eager'] / seconds['compiled']:.2f}x")


if __name__ == "__main__":
    main()
