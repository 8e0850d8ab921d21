"""bench/gpu_check.py --device cpu end to end: `pytest -m gpu` as a subprocess with its counts, a part that runs, a
part that raises and a part that runs past its budget, one markdown table and one JSON file."""

import argparse
import contextlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.filesystems import read_only_directory

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_every_kind_of_part_and_reports_what_it_could_not_run(tmp_path, monkeypatch, capfd):
    """gpu_check's `main` in this process: the check's results are the subject here (its own process, stopped by
    Ctrl-C or SIGTERM, is the two signal tests'); `pytest -m gpu` is still a real subprocess and each part a process
    forked from this one, on one thread (OpenMP's threads do not survive a fork: a parallel region this worker ran
    before would leave a forked part waiting forever; pytest-xdist's workers on 2 cores run one thread already)."""
    gpu_check = gpu_check_module(monkeypatch)
    torch.set_num_threads(1)  # the parts' --threads (conftest's process_state restores the worker's)
    command = [
        "--device", "cpu", "--out", str(tmp_path),
        "--pytest-paths", "tests/test_gpu.py",  # the marked tests live there; the whole suite's collection takes long
        "--parts", "pytest", "bert_tiny at 128 tokens", "fine-tuning", "inference", "sentence embeddings",
        "--model", "bert_unknown",  # pretrain_step.py refuses it: the fine-tuning part raises
        "--large-model", "bert_tiny",
        "--part-budget", "inference=0.01",  # less than even a forked process takes to load a model: past its budget
        "--part-budget", "bert_tiny at 128 tokens=600",  # the session's fresh cache: the demo corpus prepared first
        "--part-budget", "pytest=600",  # its budget is a GPU's; a busy CI machine collects for longer
    ]  # fmt: skip
    monkeypatch.chdir(REPO)  # as `python bench/gpu_check.py` runs from the checkout: --pytest-paths is relative
    returncode = gpu_check.main(command)
    stdout = capfd.readouterr().out
    assert returncode == 0, stdout[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    parts = report["parts"]
    # A part's whole name picks that part alone ("bert_tiny at 128 tokens, batch 32" starts so too)
    assert list(parts) == [
        "pytest -m gpu", "bert_tiny at 128 tokens", "fine-tuning step", "inference", "sentence embeddings",
    ]  # fmt: skip
    gpu_tests = parts["pytest -m gpu"]["gpu tests"]
    assert gpu_tests["counts"]["skipped"] >= 10 and set(gpu_tests["counts"]) == {"skipped"}  # no CUDA here
    assert gpu_tests["failed"] == [] and gpu_tests["exit_code"] == 0
    step = parts["bert_tiny at 128 tokens"]["eager"]
    assert "lightbert" in step, step
    assert step["lightbert"]["ms"] > 0 and step["transformers"]["ms"] > 0 and step["vs eager"].endswith("x")
    # One more step under the profiler (aten ops on a CPU), by kind; the shares cover the step
    profile = step["profile"]
    assert list(profile["kinds"]) == [
        "GEMM", "attention", "normalization", "element-wise", "loss", "optimizer", "copies", "host gaps",
    ]  # fmt: skip
    assert profile["launches"] > 50 and profile["step_ms"] > 0
    assert abs(sum(k["share"] for k in profile["kinds"].values()) - 1) < 0.01
    assert all(profile["kinds"][k]["ms"] > 0 for k in ("GEMM", "attention", "normalization", "loss", "optimizer"))
    assert "unknown --model bert_unknown" in parts["fine-tuning step"]["eager"]["error"]
    assert parts["inference"]["predict vs pipeline"] == {"not run": "the part ran past its budget of 0.01 s"}
    # bench/embedding_trainer.py's smallest run (4 steps of 16 pairs, bert_tiny's size): both sides trained and scored
    embedding = parts["sentence embeddings"]["lightbert vs sentence-transformers"]
    assert embedding["ratio_job"] > 0 and embedding["ratio_train_loop"] > 0, embedding
    assert embedding["settings"]["steps"] == 4 and embedding["device"] == "cpu" and embedding["model"]["size"] == "tiny"
    for side in ("lightbert", "sentence-transformers"):
        assert embedding[side]["step_ms"] > 0 and 0 <= embedding[side]["scores"]["ndcg_at_10"] <= 1
    assert embedding["logged_vs_recomputed_max_abs"] < 1e-5
    assert not (tmp_path / "sentence-embeddings-work").exists()  # the runs' directories are removed
    # What a committed result needs: the device, torch, the commit, and the six targets (null on a CPU)
    assert report["device"] == "cpu" and report["torch"] == torch.__version__
    assert report["commit"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", report["commit"])
    assert report["targets"] == dict.fromkeys(TARGETS)
    dated = list(tmp_path.glob("gpu-check-*-cpu.json"))
    assert len(dated) == 1 and json.loads(dated[0].read_text()) == report

    table = (tmp_path / "gpu-check.md").read_text().splitlines()
    rows = [line for line in table[:14] if line.startswith("| ") and not line.startswith("| part |")]
    assert len(rows) == 8 and table[2].startswith("| part | case | lightbert ms | throughput | % of matmul peak |")
    assert rows[0].endswith(f"| {gpu_tests['counts']['skipped']} skipped |")
    assert rows[1].startswith("| bert_tiny at 128 tokens | eager | ") and "not run" not in rows[1]
    assert "not run: SystemExit: pretrain_step.py: unknown --model bert_unknown" in rows[2]
    assert rows[3].endswith("| not run: the part ran past its budget of 0.01 s |")
    assert [row.split(" | ")[1] for row in rows[4:]] == ["whole job", "training loop", "one step", "NDCG@10"]
    assert rows[4].startswith(f"| sentence embeddings | whole job |{'  |' * 3} {embedding['ratio_job']:.2f}x |")
    assert rows[6].startswith(f"| sentence embeddings | one step | {embedding['lightbert']['step_ms']:.1f} |")
    assert "sentence-transformers" in rows[7] and "not run" not in "".join(rows[4:])
    profiled = table[table.index("Where one steady step's time goes (torch.profiler, aten ops' CPU time):") + 2 :]
    assert profiled[0].startswith("| part | case | step ms | launches | GEMM ms (share) | attention ms (share) |")
    assert profiled[2].startswith(f"| bert_tiny at 128 tokens | eager | {profile['step_ms']:.1f} | ")
    assert stdout.strip().splitlines()[-1].startswith("gpu_check: ")
    assert "2 case(s) not run" in stdout


def test_the_sentence_embeddings_part_is_not_run_without_its_reference_packages(tmp_path, monkeypatch):
    """Without accelerate (or sentence-transformers), SentenceTransformerTrainer cannot run: the part is one row saying
    so and which extra has it, and no process starts for it."""
    gpu_check = gpu_check_module(monkeypatch)
    find_spec = gpu_check.importlib.util.find_spec
    monkeypatch.setattr(
        gpu_check.importlib.util, "find_spec", lambda name: None if name == "accelerate" else find_spec(name)
    )
    monkeypatch.setattr(gpu_check.multiprocessing, "get_context", lambda method: pytest.fail("a process started"))
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--parts", "sentence embeddings"]) == 0
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    why = report["parts"]["sentence embeddings"]["lightbert vs sentence-transformers"]["not run"]
    assert why.startswith("accelerate is not installed (") and "pip install -e '.[dev]'" in why
    assert f"| sentence embeddings | lightbert vs sentence-transformers |{'  |' * 6} not run: accelerate is" in (
        (tmp_path / "gpu-check.md").read_text()
    )


def test_a_failed_embedding_worker_is_one_line_with_its_error_and_the_whole_stderr_in_a_log(tmp_path, monkeypatch):
    """bench/embedding_trainer.py stops with a worker's stderr tail (a traceback): the case's error is its first line
    and its last, and the whole of it is kept beside the table."""
    gpu_check = gpu_check_module(monkeypatch)
    import embedding_trainer

    failure = "lightbert seed 0 failed (1):\nTraceback (most recent call last):\n  File x\nValueError: boom\n"
    monkeypatch.setattr(embedding_trainer, "main", lambda argv: sys.exit(failure))
    with pytest.raises(RuntimeError) as raised:
        gpu_check.embedding_case(["--device", "cpu"], tmp_path)
    assert str(raised.value) == (
        "lightbert seed 0 failed (1): ... ValueError: boom (see sentence-embeddings-error.log)"
    )
    assert (tmp_path / "sentence-embeddings-error.log").read_text() == failure + "\n"


TARGETS = [
    "headline_bert_large_s128_b32_mfu", "bert_base_s128_b256_mfu", "bert_base_s128_b256_vs_transformers_compiled",
    "bert_large_s512_b32_real_tokens_per_s", "finetune_step_vs_transformers", "inference_vs_pipeline",
]  # fmt: skip


def test_a_pytest_run_cut_short_is_counted_from_its_lines(monkeypatch):
    """A `pytest -m gpu` stopped at its budget has no summary line: its counts come from the -v lines so far."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    import gpu_check

    log = "collected 10 items\n\ntests/test_gpu.py::a[x] FAILED [ 10%]\ntests/test_gpu.py::b PASSED [ 20%]\n"
    assert dict(gpu_check.PYTEST_LINE.findall(log)) == {
        "tests/test_gpu.py::a[x]": "FAILED",
        "tests/test_gpu.py::b": "PASSED",
    }


def gpu_check_module(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import gpu_check

    return gpu_check


BAD_ARGUMENTS = {
    "negative budget": (["--budget", "-5"], "--budget -5: give a positive number of seconds"),
    "budget not a number": (["--budget", "abc"], "argument --budget: invalid float value: 'abc'"),
    "unknown part budget": (["--part-budget", "nosuch=60"], "--part-budget nosuch=60: no part's name starts with"),
    "part budget not a number": (["--part-budget", "inference=abc"], "--part-budget inference=abc: 'abc' is not a"),
    "negative part budget": (["--part-budget", "inference=-5"], "--part-budget inference=-5: a part's budget must"),
    "part budget without a name": (["--part-budget", "60"], "--part-budget 60: give PART=SECONDS"),
    "unknown part": (["--parts", "pytest", "nosuch"], "--parts nosuch: no part's name starts so; parts: pytest -m"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS, ids=list(BAD_ARGUMENTS))
def test_a_bad_argument_is_refused_in_one_line_before_anything_is_written(case, tmp_path, monkeypatch):
    gpu_check = gpu_check_module(monkeypatch)
    given, expected = BAD_ARGUMENTS[case]
    out = tmp_path / "check"
    with pytest.raises(SystemExit) as refused:
        gpu_check.main(["--device", "cpu", "--out", str(out), *given])
    message = str(refused.value.code)
    assert message.startswith(f"gpu_check.py: {expected}") and "\n" not in message, message
    assert not out.exists()


def test_an_out_that_is_a_file_or_read_only_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    gpu_check = gpu_check_module(monkeypatch)
    a_file = tmp_path / "results.json"
    a_file.write_text("{}")
    with pytest.raises(SystemExit) as refused:
        gpu_check.main(["--device", "cpu", "--out", str(a_file)])
    assert str(refused.value.code) == (
        f"gpu_check.py: --out {a_file} is a file, not a directory; give a directory (new or existing)"
    )
    assert a_file.read_text() == "{}"
    with read_only_directory(tmp_path / "ro") as read_only, pytest.raises(SystemExit) as refused:
        gpu_check.main(["--device", "cpu", "--out", str(read_only / "check")])
    assert str(refused.value.code) == (
        f"gpu_check.py: --out {read_only / 'check'}: {read_only} is read-only; give a directory you can write to"
    )


SLEEPER = """
import os, time, pytest

@pytest.mark.gpu
def test_sleeps():
    with open(os.environ["SLEEPER_PID"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(condition, seconds: float = 180):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.1)
    raise AssertionError(f"waited {seconds} s for {condition.__doc__}")


def start_check(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """gpu_check.py --device cpu in a session of its own (a terminal's Ctrl-C reaches the whole foreground group),
    SIGINT's default restored (a background process of a non-interactive shell ignores it)."""
    return subprocess.Popen(
        [sys.executable, "bench/gpu_check.py", "--device", "cpu", "--out", str(tmp_path / "check"), *args],
        cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def test_ctrl_c_stops_the_pytest_child_and_the_run_and_still_writes_the_table(tmp_path):
    """Ctrl-C while `pytest -m gpu` runs (its child in a process group of its own, which a terminal's Ctrl-C does
    not reach): the pytest process is stopped, the next part is not started, the tables are written, exit 130."""
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "sleeper.pid"
    check = start_check(
        tmp_path, "--parts", "pytest", "fine-tuning", "--pytest-paths", str(tmp_path / "test_sleeper.py"),
        env={"SLEEPER_PID": str(pid_file)},
    )  # fmt: skip
    try:
        sleeper = int(wait_for(lambda: pid_file.is_file() and pid_file.read_text()))
        assert os.getpgid(sleeper) == sleeper != os.getpgid(check.pid)
        os.killpg(check.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        output, _ = check.communicate(timeout=60)
    finally:
        check.kill()
    assert check.returncode == 130, output[-3000:]
    assert not alive(sleeper)
    report = json.loads((tmp_path / "check" / "gpu-check.json").read_text())
    assert report["interrupted"] == "SIGINT (Ctrl-C)"
    gpu_tests = report["parts"]["pytest -m gpu"]["gpu tests"]
    assert gpu_tests["error"] == "not run to the end: interrupted by SIGINT (Ctrl-C) (counts so far)"
    assert report["parts"]["fine-tuning step"] == {"eager": {"not run": "the run was interrupted by SIGINT (Ctrl-C)"}}
    table = (tmp_path / "check" / "gpu-check.md").read_text()
    assert f"| fine-tuning step | eager |{'  |' * 6} not run: the run was interrupted by SIGINT (Ctrl-C) |" in table
    assert output.strip().splitlines()[-1].startswith("gpu_check: ") and "interrupted by SIGINT" in output


def test_sigterm_stops_a_running_part_with_its_process_group_and_skips_the_rest(tmp_path):
    """SIGTERM while a part's process runs a case: the part's process group (the part and whatever it started) is
    stopped, its case and the next part are reported as interrupted, the tables are written, exit 143."""
    check = start_check(tmp_path, "--parts", "fine-tuning", "inference")

    def part_process():
        """the part's process, leading its own process group"""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                pid, ppid, pgid = int(stat.parent.name), *map(int, stat.read_text().rsplit(")", 1)[1].split()[1:3])
                if ppid == check.pid and pgid == pid:
                    return pid
        return None

    try:
        part = wait_for(part_process)
        check.send_signal(signal.SIGTERM)
        output, _ = check.communicate(timeout=60)
    finally:
        check.kill()
    assert check.returncode == 143, output[-3000:]
    assert not alive(part)
    report = json.loads((tmp_path / "check" / "gpu-check.json").read_text())
    assert report["parts"]["fine-tuning step"] == {"eager": {"not run": "interrupted by SIGTERM"}}
    assert report["parts"]["inference"] == {"predict vs pipeline": {"not run": "the run was interrupted by SIGTERM"}}
    table = (tmp_path / "check" / "gpu-check.md").read_text()
    assert f"| fine-tuning step | eager |{'  |' * 6} not run: interrupted by SIGTERM |" in table


def test_a_ctrl_c_inside_a_part_stops_the_part(tmp_path, monkeypatch):
    """A Ctrl-C that reaches a part's process itself ends the part: the case it interrupted says so, and the part's
    next cases do not start (the check then stops the run)."""
    gpu_check = gpu_check_module(monkeypatch)
    calls = []

    def run_case(part, flags, datamodules):
        calls.append(flags)
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "run_case", run_case)
    part = gpu_check.Part("two cases", 10, {"first": ["--a"], "second": ["--b"]})
    path = tmp_path / "parts" / "two_cases.json"
    path.parent.mkdir()
    process = multiprocessing.get_context("fork").Process(target=gpu_check.part_process, args=(part, path))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 130
    assert json.loads(path.read_text()) == {"first": {"not run": "interrupted by SIGINT (Ctrl-C)"}}


def test_the_targets_are_read_from_their_cases_at_their_sizes_only(monkeypatch):
    """The six figures of "targets" come from the cases measured at their sizes on a GPU; a case that failed or was
    not run leaves its figure null, and so does every CPU run."""
    gpu_check = gpu_check_module(monkeypatch)
    step = {"lightbert": {"ms": 50.0, "tokens_per_s": 600000, "peak_percent": 41.5}, "vs compiled": "1.65x"}
    report = {
        "parts": {
            "pre-training bert_base": {"eager": step, "compiled": step},
            "bert_large at 512 tokens": {"eager": {"lightbert": {"tokens_per_s": 171000, "peak_percent": 30.0}}},
            "bert_large at 128 tokens, batch 32": {"eager": {"error": "RuntimeError: CUDA out of memory"}},
            "fine-tuning step": {"eager": {"vs eager": "1.52x"}},
            "inference": {"predict vs pipeline": {"not run": "the part ran past its budget of 50 s"}},
        }
    }
    gpu = argparse.Namespace(device="cuda", model="bert_base", large_model="bert_large")
    assert gpu_check.targets(report, gpu) == {
        "headline_bert_large_s128_b32_mfu": None,
        "bert_base_s128_b256_mfu": 0.415,
        "bert_base_s128_b256_vs_transformers_compiled": 1.65,
        "bert_large_s512_b32_real_tokens_per_s": 171000,
        "finetune_step_vs_transformers": 1.52,
        "inference_vs_pipeline": None,
    }
    smaller = argparse.Namespace(device="cuda", model="bert_small", large_model="bert_base")
    assert gpu_check.targets(report, smaller) == dict.fromkeys(TARGETS)
    assert gpu_check.targets(report, argparse.Namespace(**{**vars(gpu), "device": "cpu"})) == dict.fromkeys(TARGETS)
    assert list(gpu_check.targets(report, gpu)) == TARGETS == gpu_check.TARGETS
    assert gpu_check.results_name("NVIDIA H100 80GB HBM3").endswith("-nvidia-h100-80gb-hbm3.json")


def test_the_headline_commands_steady_rate_is_read_from_its_second_half(tmp_path, monkeypatch):
    """The headline command's tokens/s: the median of the steps its logger wrote in the second half of the run (the
    first steps compile and warm up), from Lightning's metrics.csv as a run writes it."""
    gpu_check = gpu_check_module(monkeypatch)
    metrics = tmp_path / "metrics.csv"
    rows = ["epoch,lr-AdamW/pg1,step,train/loss,train/mfu,train/tokens_per_s", ",0.0001,0,,,"]
    rates = {9: 1000.0, 19: 2000.0, 49: 9000.0, 59: 10000.0, 69: 11000.0, 99: 10500.0}
    rows += [f"0,,{step},10.2,{rate / 1e5},{rate}" for step, rate in rates.items()]
    metrics.write_text("\n".join(rows) + "\n")
    assert gpu_check.steady_rate(metrics, 100) == {
        "steady_tokens_per_s": 10500, "mfu": 0.105, "steps": 100, "logged_steps": 3,  # steps 59, 69 and 99
    }  # fmt: skip


def test_the_profile_classifies_kernels_by_name_and_caller_and_counts_the_gaps_between_them(monkeypatch):
    """bench/step_profile.py: a kernel's kind comes from its innermost telling caller (attention's matmuls are
    attention, the optimizer's adds are optimizer), else from its own name (CUDA's kernel names, aten's op names);
    host gaps are the step's wall time that no kernel covers (overlapping kernels counted once)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from step_profile import breakdown, covered, kind_of

    attention_backward = "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionForCpuBackward0"
    cpu_attention = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    assert kind_of("aten::bmm", [cpu_attention, attention_backward]) == "attention"
    assert kind_of("aten::mm", [attention_backward]) == "attention"
    assert kind_of("aten::mm", ["autograd::engine::evaluate_function: MmBackward0"]) == "GEMM"
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", ["aten::mm", "aten::linear"]) == (
        "GEMM"
    )
    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
    assert kind_of(add, ["aten::add_", "aten::_foreach_add_", "Optimizer.step#AdamW.step"]) == "optimizer"
    assert kind_of(add, ["aten::add", "aten::dropout"]) == "element-wise"
    assert kind_of("triton_per_fused_add_native_dropout_native_layer_norm_0", []) == "normalization"
    assert kind_of("aten::_log_softmax", ["aten::log_softmax", "aten::cross_entropy_loss"]) == "loss"
    assert kind_of("aten::_softmax", ["aten::softmax"]) == "attention"
    assert kind_of("Memcpy HtoD (Pageable -> Device)", []) == "copies"
    assert kind_of("aten::copy_", ["aten::_to_copy", "aten::to"]) == "copies"

    assert covered([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == 4
    profile = breakdown({"GEMM": 3.0, "copies": 1.0}, launches=7, wall_ms=5.0, busy_ms=covered([(0, 2), (1, 3)]))
    assert profile["launches"] == 7 and profile["kinds"]["host gaps"] == {"ms": 2.0, "share": 0.3333}
    assert profile["kinds"]["GEMM"] == {"ms": 3.0, "share": 0.5} and profile["kinds"]["attention"]["ms"] == 0
