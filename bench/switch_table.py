"""RESULTS.md's table "what each speed switch pays", measured in one command: every switch of the pre-training and
fine-tuning steps, each case a `bench/pretrain_step.py` (or `bench/mlm_loss.py`) run in a process of its own, then
one markdown table.

    python bench/switch_table.py                                   # this device's defaults (bert_base on a GPU)
    python bench/switch_table.py --hf-compile --out switches.md    # every case also against transformers compiled
    python bench/switch_table.py --cases defaults compile packing+compile --model bert_large --batch-size 32

On a GPU the pre-training cases are bert_base, 128 tokens, batch 256 (RESULTS.md's GPU rows) in bf16; on a CPU
bert_small at pretrain_step.py's batch of 8, in fp32 ("bf16 weights" in bf16, slow on a CPU without a bf16 unit).
A case that fails (out of memory, a missing extra) gets its error in its row, and the others still run. `--quick` is
the tests' size: bert_tiny, one repeat, graphs checked with aot_eager.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent

# name -> (script, the switches it adds). The pre-training cases time `--part pretrain`; the fine-tuning ones the
# classifier step on 32 sentences of mixed length.
CASES = {
    "defaults": ("pretrain_step.py", []),
    "compile": ("pretrain_step.py", ["--compile"]),
    "packing": ("pretrain_step.py", ["--packing"]),  # on a GPU in bf16: flash's variable-length kernel
    "packing dense mask": ("pretrain_step.py", ["--packing", "--unpad", "groups"]),
    "packing+compile": ("pretrain_step.py", ["--packing", "--compile"]),
    "bf16 weights": ("pretrain_step.py", ["--bf16-weights"]),
    "fp8+packing+compile": ("pretrain_step.py", ["--fp8", "--packing", "--compile"]),
    "finetune": ("pretrain_step.py", ["--part", "finetune"]),
    "finetune varlen": ("pretrain_step.py", ["--part", "finetune", "--unpad", "varlen"]),
    "finetune padded": ("pretrain_step.py", ["--part", "finetune", "--unpad", "false"]),
    "finetune padded+compile": ("pretrain_step.py", ["--part", "finetune", "--unpad", "false", "--compile"]),
    "losses compiled": ("mlm_loss.py", []),
}
QUICK = ["--model", "bert_tiny", "--seq-len", "64", "--batch-size", "4", "--finetune-batch-size", "8", "--warmup",
         "0", "--repeats", "1", "--compile-backend", "aot_eager"]  # fmt: skip

LIGHTBERT = re.compile(r"^(pre-training|fine-tuning) +lightbert +([\d.]+) ms/step .* ([\d.]+)% (MFU|of measured)")
RATIO = re.compile(r"speedup vs transformers: ([\d.]+)x$")
COMPILED_RATIO = re.compile(r"speedup vs transformers compiled: ([\d.]+)x$")
GRAPHS = re.compile(r"torch\.compile: (\d+) graph breaks, (\d+) recompilations")
LOSSES = re.compile(r"^compiled losses speedup vs eager: ([\d.]+)x$")
LOSSES_MS = re.compile(r"^ +compiled +([\d.]+) ms$")


def case_command(name: str, args) -> list[str]:
    script, switches = CASES[name]
    if script == "mlm_loss.py":
        # --quick: small sizes, and the compiled losses' graphs without Inductor's C++ (test_compiled_step runs that)
        quick = ["--rows", "64", "--vocab-size", "500", "--repeats", "1", "--compile-backend", "aot_eager"]
        sizes = quick if args.quick else []
        dtype = ["--dtype", "bf16"] if args.gpu else []  # what a bf16 GPU step hands the losses
        return [sys.executable, str(BENCH / script), "--device", args.device, *dtype, *sizes]
    command = [sys.executable, str(BENCH / script), "--device", args.device, *switches]
    if "--part" not in switches:
        command += ["--part", "pretrain"]
    if args.quick:
        command += QUICK
    else:
        command += ["--model", args.model, "--seq-len", str(args.seq_len)]
        command += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    return command + (["--hf-compile"] if args.hf_compile else [])


def row(name: str, output: str, returncode: int) -> dict[str, str]:
    """The case's figures from its output; '-' where the case has none, its last error line if it failed."""
    lines = output.strip().splitlines()
    if returncode != 0:
        return {"case": name, "error": (lines or ["(no output)"])[-1][:160]}
    found = {"case": name}
    for line in lines:
        if match := LIGHTBERT.match(line):
            found["ms"], found["peak"] = match[2], match[3] + "%"
        elif match := COMPILED_RATIO.search(line):
            found["vs compiled"] = match[1] + "x"
        elif match := RATIO.search(line):
            found["vs eager"] = match[1] + "x"
        elif match := GRAPHS.search(line):
            found["graphs"] = f"{match[1]} breaks, {match[2]} recompilations"
        elif match := LOSSES_MS.match(line):
            found["ms"] = match[1]  # the compiled losses' forward and backward
        elif match := LOSSES.match(line):
            found["graphs"] = f"{match[1]}x the eager losses"
    return found


def table(rows: list[dict[str, str]], peak_name: str) -> str:
    columns = ["case", "ms", "peak", "vs eager", "vs compiled", "graphs"]
    header = ["case", "lightbert ms/step", peak_name, "vs transformers", "vs transformers compiled", "torch.compile"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for found in rows:
        if "error" in found:
            out.append(f"| {found['case']} | failed: {found['error'].replace('|', '/')} |" + " |" * (len(header) - 2))
        else:
            out.append("| " + " | ".join(found.get(column, "-") for column in columns) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), metavar="CASE",
                        help=f"some of: {', '.join(CASES)}")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=None, help="default bert_base on a GPU, pretrain_step.py's on a CPU")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="pre-training batch (default 256 on a GPU)")
    parser.add_argument("--hf-compile", action="store_true", help="every case also against transformers compiled")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per case")
    parser.add_argument("--quick", action="store_true", help="the tests' sizes (bert_tiny, aot_eager, one repeat)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args()
    args.gpu = args.device == "cuda"
    args.model = args.model or ("bert_base" if args.gpu else "bert_small")
    args.batch_size = args.batch_size or (256 if args.gpu else None)

    rows = []
    for name in args.cases:
        command = case_command(name, args)
        print(f"[{name}] {' '.join(command[1:])}", flush=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            rows.append(row(name, done.stdout + ("\n" + done.stderr if done.returncode else ""), done.returncode))
        except subprocess.TimeoutExpired:
            rows.append({"case": name, "error": f"ran past --timeout {args.timeout} s"})
    result = table(rows, "MFU" if args.gpu else "% of matmul peak")
    print(result)
    if args.out is not None:
        args.out.write_text(result + "\n")


if __name__ == "__main__":
    main()
