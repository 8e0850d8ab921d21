"""README's runnable command blocks, run as written: the blocks are read from README.md itself, so the file and the
test cannot drift apart. A block is runnable when its first line is `RUNNABLE`; every line of it runs in a fresh
directory that has the checkout's src/ and conf/, with the test's venv first on PATH (`python`, `lightbert-train`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runs import REPO

RUNNABLE = "# runs as written on a CPU, no network (tests/test_readme.py)"


def runnable_blocks(readme: Path = REPO / "README.md") -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", readme.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return [block.split("\n", 1)[1] for block in blocks if block.startswith(RUNNABLE + "\n")]


def test_readme_marks_its_runnable_blocks():
    blocks = runnable_blocks()
    assert len(blocks) >= 3
    assert any("trainer=ddp8" in b for b in blocks)  # the laptop check of a GPU command
    assert any("lightbert-train" in b for b in blocks)  # the installed command


@pytest.mark.slow
@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.splitlines()[0][:70])
def test_a_runnable_readme_block_runs_as_written(block: str, tmp_path: Path):
    for name in ("src", "conf"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
