"""The whole GPU check in one command: `pytest -m gpu`, then every speed figure RESULTS.md keeps for a GPU, in one
markdown table and one JSON file.

    python bench/gpu_check.py --out gpu-check                # one GPU, no network, at most --budget s (480)
    python bench/gpu_check.py --device cpu --out gpu-check   # the same parts at tiny sizes (the test suite's run)

It writes gpu-check.md (the tables), gpu-check.json, and the same JSON as gpu-check-<date>-<device>.json, the name
under which a GPU run's results are committed to bench/results/ (bench/results/README.md). The JSON holds the device,
torch's version, the commit, every case's figures (a pre-training case's `"profile"` too) and `"targets"`: the six
figures issue 60 sets targets for, null where not run (all null with --device cpu, whose sizes are not theirs).

Parts, in order, each in a process of its own with its own time budget (a part that fails or runs past its budget is
reported as "not run: <why>" and the next part starts; the overall --budget caps them all):

1. `pytest -m gpu` as a subprocess: its passed / failed / skipped counts, and the failures by name.
2. bert_base, 128 tokens, batch 256, pre-training: lightbert eager against transformers eager, then lightbert
   compiled against transformers eager and compiled (MFU, ratios, graph breaks and recompilations).
3. bert_large at 512 tokens (batch 32): tokens/s.
4. bert_large at 128 tokens, the paper's per-device batch of 32: MFU; and the headline command itself,
   `src/train.py model=bert_large task=pretrain trainer=ddp8 trainer.devices=1` for 100 steps through Lightning, its
   steady tokens/s (`train/tokens_per_s` in metrics.csv) over the bare step's: the loop's overhead.
5. The fine-tuning step (bert_base, 32 sentences) against transformers.
6. Inference: `predict` against `transformers.pipeline` (`bench/predict_vs_pipeline.py`).
7. Each speed switch of docs/speed.md toggled from the defaults on part 2's step; a switch whose package or device
   is missing (fp8 without torchao) is reported as not run, with the reason.
8. The modern encoder's pre-training step (`--modern-model`, modernbert_base): its recipe's (masked LM alone on
   packed chunks of documents, 30% masked, StableAdamW) at 1,024 tokens, 32 rows, eager and compiled, against
   transformers' ModernBertForMaskedLM eager and compiled: its MFU. As issue 63's and not issue 60's: where the
   parts before it spend the overall budget, `--parts "pre-training modernbert"` runs it alone.
9. Sentence embeddings (issue 69): `bench/embedding_trainer.py --device cuda`, lightbert's `task=embedding` against
   sentence-transformers' `SentenceTransformerTrainer` (MultipleNegativesRankingLoss), the same BERT-Base-sized model,
   pairs, steps, schedule and seed, each side in a fresh process with its GPU defaults (lightbert: bf16-mixed,
   compiled; ST: bf16=True): the whole job's and the training loop's time ratios, one step each side, NDCG@10 each
   side. Not run without sentence-transformers and accelerate; `--parts "sentence embeddings"` runs it alone.

Every case is `bench/pretrain_step.py`'s or `bench/predict_vs_pipeline.py`'s own code, imported, and read with
`bench/switch_table.py`'s parsing, so the figures mean what those scripts print (part 9: `bench/embedding_trainer.py`'s
`main`, read from the JSON it writes). Each pre-training case also runs
one steady step of lightbert's under torch's profiler (`bench/step_profile.py`): milliseconds and share by kind of
work (GEMM, attention, normalization, element-wise, loss, optimizer, copies, host gaps) and the kernel launches,
in a second table. With `--device cpu` the sizes are tiny (bert_tiny, 64 tokens, batch 4, one repeat, graphs
compiled with aot_eager, the headline command 12 steps): every path runs, the numbers mean nothing; the profile then
counts the CPU's aten ops.

The arguments are checked before anything is written (one line, exit 1). Ctrl-C or SIGTERM stops the running part
with every process it started (each part and `pytest` run in a process group of their own), skips the parts after
it, and still writes the tables and JSON of what finished (exit 130 or 143).
"""

from __future__ import annotations

import os

# torch.cuda.is_available() through NVML, without starting CUDA in this process (--start-method fork needs that).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import argparse
import contextlib
import csv
import datetime
import importlib.util
import io
import json
import multiprocessing
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

import step_profile  # noqa: E402
import switch_table  # noqa: E402


def import_benchmarks() -> None:
    """bench/pretrain_step.py and bench/predict_vs_pipeline.py as globals (Lightning, transformers: seconds of
    imports): imported before the first part that runs them starts (a forked part inherits them), not by a check that
    runs `pytest -m gpu` alone or refuses its arguments."""
    global predict_vs_pipeline, pretrain_step
    import predict_vs_pipeline
    import pretrain_step


# A side's line of pretrain_step.py's report: ms/step, tokens/s and the share of the peak.
SIDE = re.compile(
    r"^(?:pre-training|fine-tuning) +(lightbert|transformers compiled|transformers) +([\d.]+) ms/step +(\d+) tokens/s"
    r" +[\d.]+ TFLOP/s +([\d.]+)% "
)
RATE = re.compile(r"^ +(lightbert predict|pipeline, batch \d+) +([\d.]+) examples/s")
PREDICT_RATIO = re.compile(r"predict speedup vs transformers\.pipeline: ([\d.]+)x")
PYTEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", re.MULTILINE)
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
PROFILE = re.compile(r"^profile json: (\{.*\})$", re.MULTILINE)
HEADLINE = "headline command (src/train.py)"
EMBEDDING = "lightbert vs sentence-transformers"
# The figures issue 60 sets targets for, in the JSON's "targets" (null where not run, always with --device cpu).
TARGETS = [
    "headline_bert_large_s128_b32_mfu",
    "bert_base_s128_b256_mfu",
    "bert_base_s128_b256_vs_transformers_compiled",
    "bert_large_s512_b32_real_tokens_per_s",
    "finetune_step_vs_transformers",
    "inference_vs_pipeline",
]
SIGNALS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class StopSignal(BaseException):
    """Ctrl-C or SIGTERM reached the check: what finished is still reported. A BaseException, as KeyboardInterrupt
    is, so that no `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(SIGNALS.get(signum, f"signal {signum}"))
        self.signum = signum
        self.results: dict | None = None  # the interrupted part's results so far


def raise_interrupted(signum, frame) -> None:
    raise StopSignal(signum)


@dataclass
class Part:
    name: str
    budget: float  # seconds on a GPU; on a CPU the tiny sizes need less
    cases: dict[str, list[str]] = field(default_factory=dict)  # case -> command-line flags of its script
    kind: str = "pretrain"  # pretrain | finetune | inference | embedding | pytest
    not_run: dict[str, str] = field(default_factory=dict)  # case -> why it cannot run here


def parts(args: argparse.Namespace) -> list[Part]:
    """The check's parts at this device's sizes."""
    gpu = args.device == "cuda"
    common = ["--device", args.device, "--warmup", "2" if gpu else "0", "--repeats", "5" if gpu else "1", "--profile"]
    if not gpu:
        common += ["--compile-backend", "aot_eager", "--threads", str(torch.get_num_threads())]
    base = [*common, "--model", args.model, "--seq-len", "128" if gpu else "64", "--batch-size", "256" if gpu else "4"]
    large_len = "512" if gpu else "128"
    large = [*common, "--model", args.large_model, "--batch-size", "32" if gpu else "4"]
    # The modern recipe's step (masked LM alone on packed chunks of documents, 30% masked) at its first phase's
    # context, 1,024 tokens; 32 rows, the tokens of bert_base's batch of 256 x 128
    modern = [*common, "--model", args.modern_model, "--seq-len", "1024" if gpu else "64", "--packing",
              "--batch-size", "32" if gpu else "4"]  # fmt: skip
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
    embedding_cases, embedding_not_run = {EMBEDDING: embedding_flags(args)}, {}
    packages = {"sentence_transformers": "sentence-transformers", "accelerate": "accelerate"}
    if missing := [package for name, package in packages.items() if importlib.util.find_spec(name) is None]:
        verb = "is" if len(missing) == 1 else "are"
        why = (
            f"{' and '.join(missing)} {verb} not installed (the reference side, SentenceTransformerTrainer, needs both:"
            " the dev extra, pip install -e '.[dev]'; on a GPU machine without network, their wheels on PYTHONPATH)"
        )
        embedding_cases, embedding_not_run = {}, {EMBEDDING: why}
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
        Part(
            f"{args.large_model} at 128 tokens, batch 32",
            190 if gpu else 120,  # the headline command: start-up, data, 100 steps (compile, where it is the default)
            {"eager": [*large, "--seq-len", "128"], HEADLINE: headline_overrides(args)},
        ),
        Part(
            "fine-tuning step",
            40,
            {"eager": [*base, "--part", "finetune", "--finetune-batch-size", "32"]},
            kind="finetune",
        ),
        Part("inference", 50, {"predict vs pipeline": inference_flags(args)}, kind="inference"),
        Part("speed switches", 150, switches, not_run=not_run),
        Part(
            f"pre-training {args.modern_model}",
            120,
            {"eager": modern, "compiled": [*modern, "--compile", "--hf-compile"]},
        ),
        # Two fresh processes (imports, data, a WordPiece vocabulary, bert_base written) and lightbert's compiling:
        # about 4 minutes on a GPU by estimate, never measured; on a CPU two tiny 4-step runs take about a minute.
        Part("sentence embeddings", 300, embedding_cases, kind="embedding", not_run=embedding_not_run),
    ]


def embedding_flags(args: argparse.Namespace) -> list[str]:
    """bench/embedding_trainer.py's flags: on a GPU its --device cuda defaults (bert_base's size, 1,920 pairs, 120
    steps of 64) with one seed; on a CPU its smallest run (64 pairs, 4 steps of 16, tiny), as tests/test_bench.py's."""
    threads = ["--threads", str(torch.get_num_threads()), "--seeds", "0"]
    if args.device == "cuda":
        return ["--device", "cuda", *threads]
    return ["--device", "cpu", "--quick", "--num-train", "64", "--num-dev", "40", "--batch-size", "16",
            "--max-seq-length", "32", "--vocab-size", "1000", *threads]  # fmt: skip


def headline_overrides(args: argparse.Namespace) -> list[str]:
    """`src/train.py`'s overrides for the headline command's per-device work (what `trainer=ddp8` runs on each GPU) on
    this one device; on a CPU at the bare step's tiny sizes, in fp32, for 12 steps."""
    gpu = args.device == "cuda"
    steps = 100 if gpu else 8
    overrides = [
        f"model={args.large_model}", "task=pretrain", "trainer=ddp8", "trainer.devices=1",
        f"task.batch_size={32 if gpu else 4}", "task.max_seq_length=128", f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps + 1}", f"task.checkpoint_every_n_steps={steps + 1}", "logger=csv",
    ]  # fmt: skip
    if not gpu:
        overrides += ["trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.log_every_n_steps=2"]
    return overrides


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
    if match := PROFILE.search(output):
        found["profile"] = json.loads(match[1])
    return found


def headline_case(overrides: list[str], run_dir: Path) -> dict:
    """The headline command through Lightning in a child process (this part's process group): its steady tokens/s,
    the median of `train/tokens_per_s` over the logged steps of its second half (compiling and warm-up left out)."""
    command = [sys.executable, str(REPO / "src" / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    log = run_dir.with_suffix(".log")
    started = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.run(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        last = [line for line in log.read_text().splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeError(f"src/train.py ended with exit code {code}: {last[0][:200]} (see {log.name})")
    steps = int(next(o for o in overrides if o.startswith("trainer.max_steps=")).split("=")[1])
    return {**steady_rate(run_dir / "metrics.csv", steps), "command_s": round(seconds, 1)}


def embedding_case(flags: list[str], out: Path) -> dict:
    """bench/embedding_trainer.py's comparison (its two workers are processes of this part's group): the ratios and
    each side's times and scores (medians over its seeds, the fastest run's step), its settings; its own table and
    JSON in `out` as sentence-embeddings.md/.json. The work directory (data, models, runs) is removed once it ends."""
    import embedding_trainer

    work, summary_path = out / "sentence-embeddings-work", out / "sentence-embeddings.json"
    shutil.rmtree(work, ignore_errors=True)
    argv = sys.argv
    sys.argv = ["embedding_trainer.py", *flags]  # what its summary's "command" says
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            embedding_trainer.main([*flags, "--work-dir", str(work), "--out", str(summary_path)])
    except SystemExit as error:  # a worker's failure: its stderr's tail, kept whole beside the table; one line here
        log = out / "sentence-embeddings-error.log"
        log.write_text(f"{error.code}\n")
        lines = [line.strip() for line in str(error.code).splitlines() if line.strip()] or ["no message"]
        said = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        raise RuntimeError(f"{said} (see {log.name})") from None
    finally:
        sys.argv = argv
    shutil.rmtree(work, ignore_errors=True)  # bert_base's checkpoints and exports: gigabytes
    summary = json.loads(summary_path.read_text())
    found = {"ratio_job": round(summary["ratio_job"], 3), "ratio_train_loop": round(summary["ratio_train_loop"], 3)}
    for system in ("lightbert", "sentence-transformers"):
        runs = [r for r in summary["runs"] if r["system"] == system]
        side = {
            key: round(statistics.median(r[key] for r in runs), 2) for key in ("job_s", "train_loop_s", "imports_s")
        }
        side["step_ms"] = round(min(r["step_ms"] for r in runs), 2)
        side["scores"] = {m: round(statistics.mean(r["scores"][m] for r in runs), 4) for m in embedding_trainer.METRICS}
        found[system] = side
    found["logged_vs_recomputed_max_abs"] = summary["logged_vs_recomputed_max_abs"]
    found.update({key: summary[key] for key in ("device", "model", "data", "settings", "machine")})
    return found


def steady_rate(metrics: Path, steps: int) -> dict:
    """A run's steady `train/tokens_per_s` (and `train/mfu` on a GPU) from its metrics.csv: the median of the logged
    steps of its second half, or of every logged step where the second half logged none."""
    with metrics.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/tokens_per_s")]
    if not rows:
        raise RuntimeError(f"src/train.py logged no train/tokens_per_s in {metrics}")
    steady = [r for r in rows if int(r["step"]) >= steps // 2] or rows
    found = {"steady_tokens_per_s": round(statistics.median(float(r["train/tokens_per_s"]) for r in steady))}
    if mfu := [float(r["train/mfu"]) for r in steady if r.get("train/mfu")]:
        found["mfu"] = round(statistics.median(mfu), 4)
    return {**found, "steps": steps, "logged_steps": len(steady)}


def run_case(part: Part, flags: list[str], datamodules: dict) -> str:
    """The case's printed report."""
    import_benchmarks()  # done already where the part was forked; a spawned part imports them here
    out = io.StringIO()
    if flags and "=" in flags[0]:  # src/train.py's overrides: the headline command
        return json.dumps(headline_case(flags, datamodules["out"] / "headline-run"))
    if part.kind == "embedding":
        return json.dumps(embedding_case(flags, datamodules["out"]))
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
    pretrain_step.model_config(args.model)  # an unknown size is refused before the data is prepared
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
    """Runs the part's cases in order, writing `path` after each: what finished survives a kill. Its own process
    group, so that stopping the part stops what it started too; a Ctrl-C that reaches it stops the part."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not the check's handlers, inherited by a fork
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # blocked in the check while it started this process
    results: dict[str, dict] = {}
    datamodules: dict = {"out": path.parent.parent}
    for case, flags in part.cases.items():
        started = time.perf_counter()
        try:
            output = run_case(part, flags, datamodules)
            results[case] = (
                json.loads(output) if case == HEADLINE or part.kind == "embedding" else figures(case, output)
            )
        except KeyboardInterrupt:
            results[case] = {"not run": "interrupted by SIGINT (Ctrl-C)"}
            path.write_text(json.dumps(results))
            raise SystemExit(130) from None
        except BaseException as error:  # SystemExit included: a script's sys.exit is its error message
            lines = traceback.format_exception_only(type(error), error)
            results[case] = {"error": lines[-1].strip()[:300]}
        results[case]["seconds"] = round(time.perf_counter() - started, 1)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # the next case starts from a free GPU
        path.write_text(json.dumps(results))


def stop_group(pid: int, alive: Callable[[], bool]) -> None:
    """Ends process `pid`'s process group (the child and whatever it started): SIGTERM, SIGKILL 5 s later if the
    child is still `alive()`, and SIGKILL to what is left of the group once it is not."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 5
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # the leader is gone: what it started goes too
            return


def seconds(budget: float) -> str:
    """A budget as the table says it: whole seconds, or the fraction a test gives (0.01)."""
    return f"{budget:.0f}" if budget >= 1 else f"{budget:g}"


def run_pytest(part: Part, args: argparse.Namespace, budget: float) -> dict[str, dict]:
    """`pytest -m gpu` in a subprocess of its own process group; its counts, from the summary line or, cut short,
    from the lines so far."""
    log = args.out / "pytest-gpu.log"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-v", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", *args.pytest_paths]  # fmt: skip
    started = time.perf_counter()
    interrupted = None
    with log.open("w") as f:
        process = subprocess.Popen(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, process_group=0)
        try:
            process.wait(timeout=budget)
            cut = None
        except subprocess.TimeoutExpired:
            cut = f"ran past its budget of {seconds(budget)} s"
        except StopSignal as error:
            interrupted = error
            cut = f"interrupted by {error}"
        finally:
            if process.poll() is None:
                stop_group(process.pid, lambda: process.poll() is None)
                process.wait()
    text = log.read_text()
    tests = dict(PYTEST_LINE.findall(text))
    counts = {outcome.lower(): sum(1 for o in tests.values() if o == outcome) for outcome in set(tests.values())}
    summary = [
        line for line in text.splitlines() if re.match(r"^=+ .*\b(passed|failed|skipped|error|deselected)", line)
    ]
    if summary and not cut:
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
    if interrupted:
        interrupted.results = {"gpu tests": result}
        raise interrupted
    return {"gpu tests": result}


def run_part(part: Part, args: argparse.Namespace, budget: float) -> dict[str, dict]:
    """The part's results by case: figures, an error, or why it was not run. Interrupted, it stops the part's
    process group and raises `StopSignal` holding what finished."""
    if part.kind == "pytest":
        return run_pytest(part, args, budget)
    if not part.cases:  # every case needs what is missing here: no process to start
        return {case: {"not run": reason} for case, reason in part.not_run.items()}
    import_benchmarks()
    path = args.out / "parts" / (re.sub(r"\W+", "_", part.name) + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    process = multiprocessing.get_context(args.start_method).Process(target=part_process, args=(part, path))
    why = interrupted = None
    try:
        # Ctrl-C or SIGTERM while the part starts is taken once it has started: raised inside start(), after the fork
        # but before multiprocessing records the child, it left a part running that this check could not stop.
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            process.start()
            with contextlib.suppress(OSError):  # the child does it too; whichever is first (a spawned one has exec'd)
                os.setpgid(process.pid, process.pid)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        process.join(timeout=budget)
        if process.is_alive():
            why = f"the part ran past its budget of {seconds(budget)} s"
        elif process.exitcode != 0:
            why = f"the part's process ended with exit code {process.exitcode}"
    except StopSignal as error:
        interrupted = error
        why = f"interrupted by {error}"
    finally:
        if process.is_alive():
            stop_group(process.pid, process.is_alive)
            process.join()
    results = json.loads(path.read_text()) if path.is_file() else {}
    for case in part.cases:
        if case not in results:
            results[case] = {"not run": why or "the part ended before it"}
    if HEADLINE in results and "steady_tokens_per_s" in results[HEADLINE]:
        bare = results.get("eager", {}).get("lightbert", {}).get("tokens_per_s")
        if bare:  # the loop's overhead: 1.00 means none
            results[HEADLINE]["vs bare step"] = round(results[HEADLINE]["steady_tokens_per_s"] / bare, 3)
    results.update({case: {"not run": reason} for case, reason in part.not_run.items()})
    if interrupted:
        interrupted.results = results
        raise interrupted
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
        elif case == EMBEDDING:
            rows += embedding_rows(part, found)
        elif case == HEADLINE:
            ratio = f"{found['vs bare step']:.2f}x the bare step's tokens/s" if "vs bare step" in found else ""
            mfu = f"{100 * found['mfu']:.1f}%" if "mfu" in found else ""
            notes = f"{found['steps']} steps through Lightning in {found['command_s']:.0f} s; {ratio}"
            rows.append([part, case, "", f"{found['steady_tokens_per_s']} tokens/s", mfu, "", "", "", notes])
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


def embedding_rows(part: str, found: dict) -> list[list[str]]:
    """Sentence embeddings' rows: the whole job's and the training loop's ratio (ST's time over lightbert's, in the
    "vs transformers" column), one step each side, NDCG@10 each side."""
    ours, theirs = found["lightbert"], found["sentence-transformers"]
    steps = f"{found['settings']['steps']} steps of {found['settings']['batch_size']} pairs, {found['model']['size']}"
    ndcg = f"lightbert {ours['scores']['ndcg_at_10']:.3f}, sentence-transformers {theirs['scores']['ndcg_at_10']:.3f}"
    return [
        [part, "whole job", "", "", "", f"{found['ratio_job']:.2f}x", "", "",
         f"lightbert {ours['job_s']:.1f} s, sentence-transformers {theirs['job_s']:.1f} s; {steps}"],
        [part, "training loop", "", "", "", f"{found['ratio_train_loop']:.2f}x", "", "",
         f"lightbert {ours['train_loop_s']:.1f} s, sentence-transformers {theirs['train_loop_s']:.1f} s"],
        [part, "one step", f"{ours['step_ms']:.1f}", "", "", f"{theirs['step_ms'] / ours['step_ms']:.2f}x", "", "",
         f"sentence-transformers {theirs['step_ms']:.1f} ms (median step; the fastest seed's)"],
        [part, "NDCG@10", "", "", "", "", "", "", ndcg + " (held-out docstring pairs)"],
    ]  # fmt: skip


def profile_rows(report: dict) -> list[list[str]]:
    """A row per profiled case: the step's ms, its launches, and each kind's ms and share."""
    rows = []
    for part, results in report["parts"].items():
        for case, found in results.items():
            if profile := found.get("profile"):
                kinds = [f"{k['ms']:.1f} ({100 * k['share']:.0f}%)" for k in profile["kinds"].values()]
                rows.append([part, case, f"{profile['step_ms']:.1f}", str(profile["launches"]), *kinds])
    return rows


def markdown(report: dict, peak_name: str) -> str:
    header = [h.format(peak=peak_name) for h in HEADER]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for part, results in report["parts"].items():
        for row in table_rows(part, results):
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    if profiled := profile_rows(report):
        what = "kernels' device time" if report["device"] != "cpu" else "aten ops' CPU time"
        header = ["part", "case", "step ms", "launches", *(f"{kind} ms (share)" for kind in step_profile.KINDS)]
        lines += ["", f"Where one steady step's time goes (torch.profiler, {what}):", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in profiled]
    return "\n".join(lines)


def number(text: str | None) -> float | None:
    return float(text.rstrip("x")) if text else None


def targets(report: dict, args: argparse.Namespace) -> dict[str, float | None]:
    """Issue 60's six figures from this run's results, null where not run or not at their sizes (any CPU run)."""
    found = dict.fromkeys(TARGETS)
    if args.device != "cuda":
        return found

    def case(part: str, name: str) -> dict:
        result = report["parts"].get(part, {}).get(name, {})
        return {} if "not run" in result or "error" in result else result

    if args.large_model == "bert_large":
        if peak := case("bert_large at 128 tokens, batch 32", "eager").get("lightbert", {}).get("peak_percent"):
            found["headline_bert_large_s128_b32_mfu"] = round(peak / 100, 4)
        found["bert_large_s512_b32_real_tokens_per_s"] = (
            case("bert_large at 512 tokens", "eager").get("lightbert", {}).get("tokens_per_s")
        )
    if args.model == "bert_base":
        if peak := case("pre-training bert_base", "eager").get("lightbert", {}).get("peak_percent"):
            found["bert_base_s128_b256_mfu"] = round(peak / 100, 4)
        found["bert_base_s128_b256_vs_transformers_compiled"] = number(
            case("pre-training bert_base", "compiled").get("vs compiled")
        )
        found["finetune_step_vs_transformers"] = number(case("fine-tuning step", "eager").get("vs eager"))
        found["inference_vs_pipeline"] = number(case("inference", "predict vs pipeline").get("vs eager"))
    return found


def commit() -> str | None:
    """The checkout's commit, with "-dirty" when files differ from it; None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def results_name(device: str) -> str:
    """gpu-check-<date>-<device>.json, the name a GPU run's JSON is committed under in bench/results/."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"gpu-check-{datetime.datetime.now(datetime.UTC):%Y-%m-%d}-{slug}.json"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        sys.exit(f"gpu_check.py: {message} (--help lists the arguments)")


def refuse(message: str):
    sys.exit(f"gpu_check.py: {message}")


def check_out(out: Path) -> None:
    """--out is a directory this process can create or write into: checked before anything is written."""
    if out.exists() and not out.is_dir():
        refuse(f"--out {out} is a file, not a directory; give a directory (new or existing)")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        refuse(f"--out {out}: {existing} is a file, not a directory; give a directory (new or existing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        refuse(f"--out {out}: {existing} is read-only; give a directory you can write to")


def named(given: str, names: list[str]) -> list[str]:
    """The parts `given` names: the one so named, else those whose names start so."""
    return [name for name in names if name == given] or [name for name in names if name.startswith(given)]


def check_arguments(args: argparse.Namespace, all_parts: list[Part]) -> dict[str, float]:
    """Every argument checked before anything is written (one line each); the part budgets by name."""
    names = [part.name for part in all_parts]
    listed = "; parts: " + ", ".join(names)
    if not args.budget > 0:
        refuse(f"--budget {args.budget:g}: give a positive number of seconds")
    for given in args.parts or []:
        if not named(given, names):
            refuse(f"--parts {given}: no part's name starts so{listed}")
    budgets = {}
    for given in args.part_budget:
        name, _, seconds = given.rpartition("=")
        if not name:
            refuse(f"--part-budget {given}: give PART=SECONDS, e.g. inference=60")
        if not named(name, names):
            refuse(f"--part-budget {given}: no part's name starts with {name!r}{listed}")
        try:
            budgets[name] = float(seconds)
        except ValueError:
            refuse(f"--part-budget {given}: {seconds!r} is not a number of seconds; give PART=SECONDS, e.g. {name}=60")
        if not budgets[name] > 0:
            refuse(f"--part-budget {given}: a part's budget must be a positive number of seconds")
    check_out(args.out)
    return budgets


def write_report(report: dict, args: argparse.Namespace, name: str) -> str:
    """gpu-check.json, its dated copy and gpu-check.md; the tables."""
    table = markdown(report, "MFU" if args.device == "cuda" else "% of matmul peak")
    text = json.dumps(report, indent=1)
    (args.out / "gpu-check.json").write_text(text)
    (args.out / results_name(report["device"])).write_text(text)
    (args.out / "gpu-check.md").write_text(f"{name}, torch {torch.__version__}, {report['seconds']} s\n\n{table}\n")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="directory for gpu-check.md/.json")
    parser.add_argument("--budget", type=float, default=480, help="seconds for everything; each part has its own too")
    parser.add_argument("--model", default=None, help="default bert_base on a GPU, bert_tiny on a CPU")
    parser.add_argument("--large-model", default=None, help="default bert_large on a GPU, bert_tiny on a CPU")
    parser.add_argument(
        "--modern-model",
        default=None,
        help="the modern encoder's size: default modernbert_base on a GPU, _tiny on a CPU",
    )
    parser.add_argument("--parts", nargs="+", default=None, metavar="PART",
                        help="only these parts: a name, or its start (pytest, pre-training, speed, ...)")  # fmt: skip
    parser.add_argument("--pytest-paths", nargs="+", default=["tests"], help="what `pytest -m gpu` collects")
    parser.add_argument("--part-budget", action="append", default=[], metavar="PART=SECONDS",
                        help="a part's budget (its name's start, e.g. inference=60)")  # fmt: skip
    parser.add_argument(
        "--start-method", choices=["spawn", "fork"], default=None,
        help="how each part's process starts: default spawn on CUDA (a fork cannot use CUDA), fork on a CPU (faster)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    args.start_method = args.start_method or ("spawn" if gpu else "fork")
    args.model = args.model or ("bert_base" if gpu else "bert_tiny")
    args.large_model = args.large_model or ("bert_large" if gpu else "bert_tiny")
    args.modern_model = args.modern_model or ("modernbert_base" if gpu else "modernbert_tiny")
    all_parts = parts(args)
    names = [part.name for part in all_parts]
    budgets = check_arguments(args, all_parts)
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    name = torch.cuda.get_device_name(0) if gpu else f"CPU, {torch.get_num_threads()} threads"
    report = {
        "device": name if gpu else "cpu", "device_detail": name, "torch": torch.__version__, "commit": commit(),
        "budget_s": args.budget, "targets": dict.fromkeys(TARGETS), "parts": {},
    }  # fmt: skip
    interrupted = None
    handlers = {sig: signal.signal(sig, raise_interrupted) for sig in SIGNALS}
    try:
        for part in all_parts:
            if args.parts and not any(part.name in named(given, names) for given in args.parts):
                continue
            cases = [*(part.cases or (["gpu tests"] if part.kind == "pytest" else [])), *part.not_run]
            if interrupted:
                report["parts"][part.name] = {
                    c: {"not run": f"the run was interrupted by {interrupted}"} for c in cases
                }
                continue
            left = args.budget - (time.perf_counter() - started)
            given = next((s for n, s in budgets.items() if part.name in named(n, names)), part.budget)
            budget = min(given, left)
            if left < 1:  # a part's own budget may be shorter (a test's 0.01 s); the overall one is spent
                report["parts"][part.name] = {
                    case: {"not run": f"the overall budget of {args.budget:.0f} s (--budget) was spent"}
                    for case in cases
                }
            else:
                print(f"[{time.perf_counter() - started:5.0f} s] {part.name} (budget {seconds(budget)} s)", flush=True)
                try:
                    report["parts"][part.name] = run_part(part, args, budget)
                except StopSignal as error:
                    interrupted = error
                    report["parts"][part.name] = error.results or {
                        c: {"not run": f"interrupted by {error}"} for c in cases
                    }
            report["targets"] = targets(report, args)
            (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1))
    except StopSignal as error:  # between parts
        interrupted = error
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    report["seconds"] = round(time.perf_counter() - started, 1)
    if interrupted:
        report["interrupted"] = str(interrupted)
    report["targets"] = targets(report, args)
    table = write_report(report, args, name)
    print(table)
    missing = sum(
        "not run" in found or "error" in found for results in report["parts"].values() for found in results.values()
    )
    said = f"; interrupted by {interrupted}" if interrupted else ""
    print(f"gpu_check: {report['seconds']:.0f} s; {missing} case(s) not run{said}; {args.out / 'gpu-check.md'}")
    return 128 + interrupted.signum if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
