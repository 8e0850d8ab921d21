"""bench/gpu_check.py --device cpu end to end: `pytest -m gpu` as a subprocess with its counts, a part that runs, a
part that raises and a part that runs past its budget, one markdown table and one JSON file."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_every_kind_of_part_and_reports_what_it_could_not_run(tmp_path):
    command = [
        sys.executable, "bench/gpu_check.py", "--device", "cpu", "--out", str(tmp_path),
        "--pytest-paths", "tests/test_gpu.py",  # the marked tests live there; the whole suite's collection takes long
        "--parts", "pytest", "bert_unknown", "fine-tuning", "inference",
        "--large-model", "bert_unknown",  # pretrain_step.py refuses it: those parts raise
        "--part-budget", "inference=1",  # less than a process takes to start: past its budget
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    parts = report["parts"]
    assert list(parts) == [
        "pytest -m gpu", "bert_unknown at 128 tokens", "bert_unknown at 128 tokens, batch 32", "fine-tuning step",
        "inference",
    ]  # fmt: skip
    gpu_tests = parts["pytest -m gpu"]["gpu tests"]
    assert gpu_tests["counts"]["skipped"] >= 10 and set(gpu_tests["counts"]) == {"skipped"}  # no CUDA here
    assert gpu_tests["failed"] == [] and gpu_tests["exit_code"] == 0
    assert "unknown --model bert_unknown" in parts["bert_unknown at 128 tokens"]["eager"]["error"]
    finetune = parts["fine-tuning step"]["eager"]
    assert finetune["lightbert"]["ms"] > 0 and finetune["transformers"]["ms"] > 0 and finetune["vs eager"].endswith("x")
    assert parts["inference"]["predict vs pipeline"] == {"not run": "the part ran past its budget of 1 s"}

    table = (tmp_path / "gpu-check.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| part |")]
    assert len(rows) == 5 and table[2].startswith("| part | case | lightbert ms | throughput | % of matmul peak |")
    assert rows[0].endswith(f"| {gpu_tests['counts']['skipped']} skipped |")
    assert "not run: SystemExit: pretrain_step.py: unknown --model bert_unknown" in rows[1]
    assert rows[3].startswith("| fine-tuning step | eager | ") and "not run" not in rows[3]
    assert rows[4].endswith("| not run: the part ran past its budget of 1 s |")
    assert done.stdout.strip().splitlines()[-1].startswith("gpu_check: ")
    assert "3 case(s) not run" in done.stdout


def test_a_pytest_run_cut_short_is_counted_from_its_lines(monkeypatch):
    """A `pytest -m gpu` stopped at its budget has no summary line: its counts come from the -v lines so far."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    import gpu_check

    log = "collected 10 items\n\ntests/test_gpu.py::a[x] FAILED [ 10%]\ntests/test_gpu.py::b PASSED [ 20%]\n"
    assert dict(gpu_check.PYTEST_LINE.findall(log)) == {
        "tests/test_gpu.py::a[x]": "FAILED",
        "tests/test_gpu.py::b": "PASSED",
    }
