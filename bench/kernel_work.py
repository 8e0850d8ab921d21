"""The model-side kernel work of issue 60, each change against what it replaced, in one process:

    python bench/kernel_work.py                        # CPU, bert_base's sizes, a batch of 8 x 128 tokens
    python bench/kernel_work.py --device cuda --dtype bf16 --tokens 32768

- `qkv`: the attention's projection, one Linear of 3H outputs (the model's `qkv`) against three of H (transformers'
  query, key, value), forward and backward, on the batch's tokens.
- `vocab`: the MLM decoder's GEMM and the loss on the predicted positions (15%) over the embeddings' rows padded to
  a multiple of 64 (the model's; the logits cut to the vocabulary's, a view) against the vocabulary's own rows.
- `lamb`: one LAMB step of bert_base's parameters in the run's groups, multi-tensor (`torch._foreach_*`, the
  default) against the per-parameter loop; and `masters`: MasterWeights' casts around an AdamW step of a bf16 model.

Each line gives the median time per call (calls interleaved) and the aten operations each side dispatches per call,
which on a GPU are its kernel launches (a deterministic count: it predicts launch-bound time where the clock is noisy).
Both sides give the same numbers before anything is timed.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from lightbert.model import BertConfig, BertForPreTraining
from lightbert.model.bert import padded_vocab
from lightbert.optim import Lamb, MasterWeights, parameter_groups

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a file (or forked by the tests): its neighbours
from pretrain_step import time_interleaved


class CountOps(TorchDispatchMode):
    """Counts the aten operations dispatched inside it (views included: they launch nothing, but are few)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def dispatched(fn) -> int:
    with CountOps() as counter:
        fn()
    return sum(counter.ops.values())


def report(title: str, steps: dict, device: torch.device, args) -> None:
    seconds = time_interleaved(steps, device, args.warmup, args.repeats)
    ops = {name: dispatched(fn) for name, fn in steps.items()}
    print(title)
    for name in steps:
        print(f"  {name:28} {1e3 * seconds[name]:9.2f} ms  {ops[name]:6d} aten ops")
    first, second = list(steps)
    print(f"  {second} / {first}: {seconds[second] / seconds[first]:.2f}x the time")


def qkv(args, device, dtype) -> None:
    hidden, tokens = args.hidden, args.tokens
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    fused = torch.nn.Linear(hidden, 3 * hidden, device=device, dtype=dtype)
    apart = [torch.nn.Linear(hidden, hidden, device=device, dtype=dtype) for _ in range(3)]
    with torch.no_grad():
        for linear, weight, bias in zip(apart, fused.weight.chunk(3), fused.bias.chunk(3), strict=True):
            linear.weight.copy_(weight), linear.bias.copy_(bias)
    grad = torch.randn(tokens, 3 * hidden, device=device, dtype=dtype)

    def one() -> torch.Tensor:
        out = fused(x)
        out.backward(grad)
        return out

    def three() -> torch.Tensor:
        out = torch.cat([linear(x) for linear in apart], -1)  # the cat is the test's, not timed apart
        out.backward(grad)
        return out

    torch.testing.assert_close(one(), three(), atol=1e-2 if dtype == torch.bfloat16 else 1e-5, rtol=1e-3)
    parts = list(zip(apart, grad.chunk(3, -1), strict=True))
    steps = {"three Linear (H -> H)": lambda: [linear(x).backward(g) for linear, g in parts]}
    steps["one fused Linear (H -> 3H)"] = lambda: fused(x).backward(grad)
    report(f"QKV projection, forward + backward: {tokens} tokens, H {hidden}, {args.dtype}", steps, device, args)


def vocab(args, device, dtype) -> None:
    rows, vocab_size = args.tokens * 15 // 100, args.vocab_size
    torch.manual_seed(0)
    hidden = torch.randn(rows, args.hidden, device=device, dtype=dtype)
    labels = torch.randint(0, vocab_size, (rows,), device=device)
    padded = torch.zeros(padded_vocab(vocab_size), args.hidden, device=device, dtype=dtype)
    padded[:vocab_size] = torch.randn(vocab_size, args.hidden, device=device, dtype=dtype) * 0.02
    padded.requires_grad_()
    exact = padded.detach()[:vocab_size].clone().requires_grad_()

    def step(weight: torch.Tensor) -> torch.Tensor:
        weight.grad = None
        logits = F.linear(hidden, weight).narrow(-1, 0, vocab_size)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        return loss

    torch.testing.assert_close(step(padded), step(exact))
    steps = {f"{vocab_size} rows": lambda: step(exact)}
    steps[f"{padded_vocab(vocab_size)} rows (padded)"] = lambda: step(padded)
    report(f"MLM decoder + loss, forward + backward: {rows} predictions, {args.dtype}", steps, device, args)


def lamb(args, device, dtype) -> None:
    config = BertConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64)
    config = BertConfig(**{**config.to_dict(), "intermediate_size": 4 * args.hidden})
    models, optimizers = [], {}
    for name, foreach in (("per-parameter loop", False), ("multi-tensor (_foreach)", True)):
        torch.manual_seed(0)
        model = BertForPreTraining(config).to(device)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        optimizers[name] = Lamb(parameter_groups(model, 0.01, row_blocks=True), lr=1e-3, foreach=foreach)
        models.append(model)
    for optimizer in optimizers.values():
        optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    count = sum(p.numel() for p in models[0].parameters()) / 1e6
    title = f"LAMB step: {len(list(models[0].parameters()))} tensors, {count:.0f}M parameters, fp32"
    report(title, {name: optimizer.step for name, optimizer in optimizers.items()}, device, args)

    optimizers = {}
    for name, foreach in (("per-weight casts", False), ("multi-tensor casts", True)):
        torch.manual_seed(0)
        model = BertForPreTraining(config).to(device).bfloat16()
        for p in model.parameters():
            p.grad = (torch.randn_like(p, dtype=torch.float32) * 1e-3).bfloat16()

        def adamw(groups):
            return torch.optim.AdamW(groups, lr=1e-4, fused=device.type in ("cpu", "cuda"))

        groups = parameter_groups(model, 0.01)
        for group in groups:
            del group["adapt"]
        optimizers[name] = MasterWeights(groups, adamw, foreach=foreach)
    report("MasterWeights around fused AdamW, bf16 model", {n: o.step for n, o in optimizers.items()}, device, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["qkv", "vocab", "lamb"], default=["qkv", "vocab", "lamb"])
    parser.add_argument("--tokens", type=int, default=8 * 128, help="the batch's tokens (B x T)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12, help="for the optimizer step's parameters")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="qkv's and vocab's tensors")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    for part in args.parts:
        {"qkv": qkv, "vocab": vocab, "lamb": lamb}[part](args, device, dtype)


if __name__ == "__main__":
    main()
