"""The whole GPU check in one command: `pytest -m gpu`, then every speed figure RESULTS.md keeps for a GPU, in one
markdown table and one JSON file.

    python bench/gpu_check.py --out gpu-check                # one GPU, no network, at most --budget s (480)
    python bench/gpu_check.py --device cpu --out gpu-check   # the same parts at tiny sizes (the test suite's run)

Parts, in order, each in a process of its own with its own time budget (a part that fails or runs past its budget is
reported as "not run: <why>" and the next part starts; the overall --budget caps them all):

1. `pytest -m gpu` as a subprocess: its passed / failed / skipped counts, and the failures by name.
2. bert_base, 128 tokens, batch 256, pre-training: lightbert eager against transformers eager, then lightbert
   compiled against transformers eager and compiled (MFU, ratios, graph breaks and recompilations).
3. bert_large at 512 tokens (batch 32): tokens/s.
4. bert_large at 128 tokens, the paper's per-device batch of 32: MFU.
5. The fine-tuning step (bert_base, 32 sentences) against transformers.
6. Inference: `predict` against `transformers.pipeline` (`bench/predict_vs_pipeline.py`).
7. Each speed switch of docs/speed.md toggled from the defaults on part 2's step; a switch whose package or device
   is missing (fp8 without torchao) is reported as not run, with the reason.

Every case is `bench/pretrain_step.py`'s or `bench/predict_vs_pipeline.py`'s own code, imported, and read with
`bench/switch_table.py`'s parsing, so the figures mean what those scripts print. With `--device cpu` the sizes are
tiny (bert_tiny, 64 tokens, batch 4, one repeat, graphs compiled with aot_eager): every path runs, the numbers mean
nothing.
"""

from __future__ import annotations

import os

# torch.cuda.is_available() through NVML, without starting CUDA in this process (--start-method fork needs that).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import argparse
import contextlib
import importlib.util
import io
import json
import multiprocessing
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import predict_vs_pipeline  # noqa: E402
import pretrain_step  # noqa: E402
import switch_table  # noqa: E402

# A side's line of pretrain_step.py's report: ms/step, tokens/s and the share of the peak.
SIDE = re.compile(
    r"^(?:pre-training|fine-tuning) +(lightbert|transformers compiled|transformers) +([\d.]+) ms/step +(\d+) tokens/s"
    r" +[\d.]+ TFLOP/s +([\d.]+)% "
)
RATE = re.compile(r"^ +(lightbert predict|pipeline, batch \d+) +([\d.]+) examples/s")
PREDICT_RATIO = re.compile(r"predict speedup vs transformers\.pipeline: ([\d.]+)x")
PYTEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", re.MULTILINE)
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


@dataclass
class Part:
    name: str
    budget: float  # seconds on a GPU; on a CPU the tiny sizes need less
    cases: dict[str, list[str]] = field(default_factory=dict)  # case -> command-line flags of its script
    kind: str = "pretrain"  # pretrain | finetune | inference | pytest
    not_run: dict[str, str] = field(default_factory=dict)  # case -> why it cannot run here


def parts(args: argparse.Namespace) -> list[Part]:
    """The check's parts at this device's sizes."""
    gpu = args.device == "cuda"
    common = ["--device", args.device, "--warmup", "2" if gpu else "0", "--repeats", "5" if gpu else "1"]
    if not gpu:
        common += ["--compile-backend", "aot_eager", "--threads", str(torch.get_num_threads())]
    base = [*common, "--model", args.model, "--seq-len", "128" if gpu else "64", "--batch-size", "256" if gpu else "4"]
    large_len = "512" if gpu else "128"
    large = [*common, "--model", args.large_model, "--batch-size", "32" if gpu else "4"]
    switches = {
        "speed.unpad=groups": [*base, "--unpad", "groups"],
        "speed.unpad=varlen": [*base, "--unpad", "varlen"],
        "task.module.sparse_mlm_head=false": [*base, "--dense-mlm-head"],
        "optim.fused=false": [*base, "--foreach"],
        "trainer.precision=bf16-true": [*base, "--bf16-weights"],
        "task.datamodule.packing=true": [*base, "--packing"],
        "speed.fp8=true": [*base, "--fp8"],
        "packing + speed.compile": [*base, "--packing", "--compile"],  # last: it compiles
    }
    not_run = {
        "speed.compile_mode=reduce-overhead": "pretrain_step.py times compile's default mode; pytest -m gpu's "
        "test_reduce_overhead_with_packing_records_no_graph_after_its_warm_up runs CUDA graphs",
        "speed.matmul_precision": "it changes fp32 matmuls only, and these steps run in bf16",
    }
    if importlib.util.find_spec("torchao") is None:
        del switches["speed.fp8=true"]
        not_run["speed.fp8=true"] = "torchao is not installed (the fp8 extra: pip install -e '.[fp8]')"
    elif gpu and torch.cuda.get_device_capability(0) < (8, 9):
        del switches["speed.fp8=true"]
        not_run["speed.fp8=true"] = "float8 matmuls need compute capability 8.9 (H100, Ada)"
    return [
        Part("pytest -m gpu", 150, kind="pytest"),
        Part(f"pre-training {args.model}", 180, {"eager": base, "compiled": [*base, "--compile", "--hf-compile"]}),
        Part(f"{args.large_model} at {large_len} tokens", 45, {"eager": [*large, "--seq-len", large_len]}),
        Part(f"{args.large_model} at 128 tokens, batch 32", 40, {"eager": [*large, "--seq-len", "128"]}),
        Part(
            "fine-tuning step",
            40,
            {"eager": [*base, "--part", "finetune", "--finetune-batch-size", "32"]},
            kind="finetune",
        ),
        Part("inference", 50, {"predict vs pipeline": inference_flags(args)}, kind="inference"),
        Part("speed switches", 150, switches, not_run=not_run),
    ]


def inference_flags(args: argparse.Namespace) -> list[str]:
    if args.device == "cuda":
        sizes = ["--model", args.model, "--sentences", "1024", "--pipeline-batch-sizes", "64,128"]
        # fp32 on both sides, as the H100 baseline measured it (bf16 rounding can flip a near-tie label)
        return ["--device", "cuda", "--dtype", "fp32", *sizes, "--repeats", "3", "--warmup", "1"]
    sizes = ["--model", "bert_tiny", "--sentences", "32", "--vocab-size", "2000", "--pipeline-batch-sizes", "8"]
    return ["--device", "cpu", *sizes, "--repeats", "1", "--warmup", "0", "--threads", str(torch.get_num_threads())]


# -- one part, in its own process -------------------------------------------------------------------------------------


def figures(name: str, output: str) -> dict:
    """A pretrain_step.py case's numbers from what it printed (switch_table.py's reading, plus every side's)."""
    found = {k: v for k, v in switch_table.row(name, output, 0).items() if k != "case"}
    for line in output.splitlines():
        if match := SIDE.match(line):
            found[match[1]] = {"ms": float(match[2]), "tokens_per_s": int(match[3]), "peak_percent": float(match[4])}
        elif match := RATE.match(line):
            found[match[1]] = {"examples_per_s": float(match[2])}
        elif match := PREDICT_RATIO.search(line):
            found["vs eager"] = match[1] + "x"
    return found


def run_case(part: Part, flags: list[str], datamodules: dict) -> str:
    """The case's printed report."""
    out = io.StringIO()
    if part.kind == "inference":
        argv = sys.argv
        sys.argv = ["predict_vs_pipeline.py", *flags]
        try:
            with contextlib.redirect_stdout(out):
                predict_vs_pipeline.main()
        finally:
            sys.argv = argv
        return out.getvalue()
    args = pretrain_step.parse_args(flags)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # as pretrain_step.py: fp32 means fp32 on both sides
    key = (args.seq_len, args.batch_size)
    if key not in datamodules:
        with contextlib.redirect_stdout(io.StringIO()):
            datamodules[key] = pretrain_step.demo_datamodule(args)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    if (device, dtype) not in datamodules:  # the measured peak of a CPU: seconds, so once per part
        peak = pretrain_step.gpu_peak_flops(device) or pretrain_step.matmul_peak(device, dtype)
        datamodules[device, dtype] = peak
    peak = datamodules[device, dtype]
    bench = pretrain_step.bench_finetune if part.kind == "finetune" else pretrain_step.bench_pretrain
    with contextlib.redirect_stdout(out):
        ratio = bench(args, datamodules[key], device, peak)
        print(f"speedup vs transformers: {ratio:.2f}x")
    return out.getvalue()


def part_process(part: Part, path: Path) -> None:
    """Runs the part's cases in order, writing `path` after each: what finished survives a kill."""
    results: dict[str, dict] = {}
    datamodules: dict = {}
    for case, flags in part.cases.items():
        started = time.perf_counter()
        try:
            output = run_case(part, flags, datamodules)
            results[case] = figures(case, output)
        except BaseException as error:  # SystemExit included: a script's sys.exit is its error message
            lines = traceback.format_exception_only(type(error), error)
            results[case] = {"error": lines[-1].strip()[:300]}
        results[case]["seconds"] = round(time.perf_counter() - started, 1)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the next case starts from a free GPU
        path.write_text(json.dumps(results))


def run_pytest(part: Part, args: argparse.Namespace, budget: float) -> dict[str, dict]:
    """`pytest -m gpu` in a subprocess; its counts, from the summary line or, cut short, from the lines so far."""
    log = args.out / "pytest-gpu.log"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-v", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", *args.pytest_paths]  # fmt: skip
    started = time.perf_counter()
    with log.open("w") as f:
        process = subprocess.Popen(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=budget)
            cut = None
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            cut = f"ran past its budget of {budget:.0f} s"
    text = log.read_text()
    tests = dict(PYTEST_LINE.findall(text))
    counts = {outcome.lower(): sum(1 for o in tests.values() if o == outcome) for outcome in set(tests.values())}
    summary = [
        line for line in text.splitlines() if re.match(r"^=+ .*\b(passed|failed|skipped|error|deselected)", line)
    ]
    if summary:
        counts = {
            ("error" if word.startswith("error") else word): int(n) for n, word in PYTEST_COUNT.findall(summary[-1])
        }
        counts.pop("deselected", None)
    result = {
        "counts": counts,
        "failed": sorted(t for t, o in tests.items() if o in ("FAILED", "ERROR")),
        "exit_code": process.returncode,
        "log": log.name,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if cut:
        result["error"] = f"not run to the end: {cut} (counts so far)"
    elif not summary:
        result["error"] = f"pytest ended with exit code {process.returncode} and no summary; see {log.name}"
    return {"gpu tests": result}


def run_part(part: Part, args: argparse.Namespace, budget: float) -> dict[str, dict]:
    """The part's results by case: figures, an error, or why it was not run."""
    if part.kind == "pytest":
        return run_pytest(part, args, budget)
    path = args.out / "parts" / (re.sub(r"\W+", "_", part.name) + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    process = multiprocessing.get_context(args.start_method).Process(target=part_process, args=(part, path))
    process.start()
    process.join(timeout=budget)
    why = None
    if process.is_alive():
        process.kill()
        process.join()
        why = f"the part ran past its budget of {budget:.0f} s"
    elif process.exitcode != 0:
        why = f"the part's process ended with exit code {process.exitcode}"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for case in part.cases:
        if case not in results:
            results[case] = {"not run": why or "the part ended before it"}
    results.update({case: {"not run": reason} for case, reason in part.not_run.items()})
    return results


# -- the report -------------------------------------------------------------------------------------------------------

HEADER = ["part", "case", "lightbert ms", "throughput", "{peak}", "vs transformers", "vs transformers compiled",
          "transformers {peak}", "notes"]  # fmt: skip


def table_rows(part: str, results: dict[str, dict]) -> list[list[str]]:
    rows = []
    for case, found in results.items():
        if "not run" in found:
            rows.append([part, case, "", "", "", "", "", "", f"not run: {found['not run']}"])
        elif part.startswith("pytest"):
            counts = ", ".join(f"{n} {word}" for word, n in sorted(found["counts"].items())) or "no tests"
            failed = f"; failed: {', '.join(found['failed'])}" if found["failed"] else ""
            rows.append([part, "", "", "", "", "", "", "", counts + failed + (f"; {found['error']}" if "error" in found
                                                                             else "")])  # fmt: skip
        elif "error" in found:
            rows.append([part, case, "", "", "", "", "", "", f"not run: {found['error']}"])
        else:
            ours = found.get("lightbert", {})
            hf = found.get("transformers compiled") or found.get("transformers") or {}
            throughput = f"{ours['tokens_per_s']} tokens/s" if ours else ""
            if "lightbert predict" in found:
                throughput = f"{found['lightbert predict']['examples_per_s']:.0f} examples/s"
            peak = f"{ours['peak_percent']}%" if ours else ""
            hf_peak = f"{hf['peak_percent']}%" if hf else ""
            notes = found.get("graphs", "")
            rows.append([part, case, f"{ours['ms']}" if ours else "", throughput, peak, found.get("vs eager", ""),
                         found.get("vs compiled", ""), hf_peak, notes])  # fmt: skip
    return rows


def markdown(report: dict, peak_name: str) -> str:
    header = [h.format(peak=peak_name) for h in HEADER]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for part, results in report["parts"].items():
        for row in table_rows(part, results):
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="directory for gpu-check.md/.json")
    parser.add_argument("--budget", type=float, default=480, help="seconds for everything; each part has its own too")
    parser.add_argument("--model", default=None, help="default bert_base on a GPU, bert_tiny on a CPU")
    parser.add_argument("--large-model", default=None, help="default bert_large on a GPU, bert_tiny on a CPU")
    parser.add_argument("--parts", nargs="+", default=None, metavar="PART",
                        help="only the parts whose names start so (pytest, pre-training, speed, ...)")  # fmt: skip
    parser.add_argument("--pytest-paths", nargs="+", default=["tests"], help="what `pytest -m gpu` collects")
    parser.add_argument("--part-budget", action="append", default=[], metavar="PART=SECONDS",
                        help="a part's budget (its name's start, e.g. inference=60)")  # fmt: skip
    parser.add_argument(
        "--start-method", choices=["spawn", "fork"], default=None,
        help="how each part's process starts: default spawn on CUDA (a fork cannot use CUDA), fork on a CPU (faster)",
    )  # fmt: skip
    args = parser.parse_args()
    gpu = args.device == "cuda"
    args.start_method = args.start_method or ("spawn" if gpu else "fork")
    args.model = args.model or ("bert_base" if gpu else "bert_tiny")
    args.large_model = args.large_model or ("bert_large" if gpu else "bert_tiny")
    args.out.mkdir(parents=True, exist_ok=True)
    budgets = {}
    for given in args.part_budget:
        name, _, seconds = given.rpartition("=")
        if not name:
            sys.exit(f"gpu_check.py: --part-budget takes PART=SECONDS, got {given!r}")
        budgets[name] = float(seconds)

    started = time.perf_counter()
    name = torch.cuda.get_device_name(0) if gpu else f"CPU, {torch.get_num_threads()} threads"
    report = {"device": name, "torch": torch.__version__, "budget_s": args.budget, "parts": {}}
    for part in parts(args):
        if args.parts and not any(part.name.startswith(p) for p in args.parts):
            continue
        left = args.budget - (time.perf_counter() - started)
        budget = min(next((s for n, s in budgets.items() if part.name.startswith(n)), part.budget), left)
        if budget < 1:
            report["parts"][part.name] = {
                case: {"not run": f"the overall budget of {args.budget:.0f} s (--budget) was spent"}
                for case in [*(part.cases or ["gpu tests"]), *part.not_run]
            }
        else:
            print(f"[{time.perf_counter() - started:5.0f} s] {part.name} (budget {budget:.0f} s)", flush=True)
            report["parts"][part.name] = run_part(part, args, budget)
        (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1))
    report["seconds"] = round(time.perf_counter() - started, 1)
    table = markdown(report, "MFU" if gpu else "% of matmul peak")
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1))
    (args.out / "gpu-check.md").write_text(f"{name}, torch {torch.__version__}, {report['seconds']} s\n\n{table}\n")
    print(table)
    missing = sum(
        "not run" in found or "error" in found for results in report["parts"].values() for found in results.values()
    )
    print(f"gpu_check: {report['seconds']:.0f} s; {missing} case(s) not run; {args.out / 'gpu-check.md'}")


if __name__ == "__main__":
    main()
