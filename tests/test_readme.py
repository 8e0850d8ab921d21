"""The runnable command blocks of README.md and of every page of docs/, run as written: the blocks are read from the
pages themselves, so the pages and the test cannot drift apart. A block is runnable when its first line is
`RUNNABLE`; every line of it runs in a fresh directory that has the checkout's src/ and conf/, with a user's
install of lightbert first on PATH (`helpers.runtime`: `python`, `lightbert-train`), as `pip install -e .` gives."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import runtime
from helpers.runs import CONF_DIR, REPO, console_noise

RUNNABLE = "# runs as written on a CPU, no network (tests/test_readme.py)"
# docs/scale.md's laptop check of a GPU command: its block's console is checked too (test_a_runnable_block_...).
LAPTOP_CHECK = "trainer=ddp8 trainer.accelerator=cpu"


def pages() -> list[Path]:
    """README.md and every page of the docs site, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def runnable_blocks_of(page: Path) -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return [block.split("\n", 1)[1] for block in blocks if block.startswith(RUNNABLE + "\n")]


def runnable_blocks() -> list[tuple[str, str]]:
    """(page, block) for every runnable block of every page."""
    return [(str(page.relative_to(REPO)), block) for page in pages() for block in runnable_blocks_of(page)]


def test_the_pages_mark_their_runnable_blocks():
    found = runnable_blocks()
    assert any(page.startswith("docs/") for page, _ in found)  # docs/ is read, not only README.md
    blocks = [block for _, block in found]
    assert len(blocks) >= 3
    assert sum(LAPTOP_CHECK in b for b in blocks) == 1  # the laptop check of a GPU command, its console checked
    assert any("lightbert-train" in b for b in blocks)  # the installed command
    assert any("--cfg job" in b for b in blocks)  # what a command would run, without running it


GROUPS = ("model", "task", "corpus", "optim", "trainer", "cluster", "logger", "sweep", "experiment", "debug")
OPTION = re.compile(rf"(?<![\w.+~/-])({'|'.join(GROUPS)})=([a-z][\w/]*)")


def test_every_option_the_pages_name_is_in_conf():
    """`group=option` anywhere on a page (commands and prose) names a file under conf/<group>/, so a renamed or
    removed option cannot live on in the docs. An option that the page's own diff adds (Adding a task) counts."""
    for page in pages():
        text = page.read_text(encoding="utf-8")
        added = set(re.findall(r"^\+\+\+ b/conf/(\S+)\.yaml$", text, flags=re.MULTILINE))
        for group, option in set(OPTION.findall(text)):
            if option == "null":  # `logger=null`: unsetting a group is Hydra's, not an option
                continue
            exists = (CONF_DIR / group / f"{option}.yaml").is_file() or f"{group}/{option}" in added
            assert exists, f"{page.relative_to(REPO)} names {group}={option}, which conf/{group}/ does not hold"


def test_a_marker_is_never_lost_to_another_fence():
    """A runnable marker in a block that is not a ```bash fence would silently not run: every marker is counted."""
    for page in pages():
        markers = re.findall(rf"^{re.escape(RUNNABLE)}$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
        assert len(markers) == len(runnable_blocks_of(page)), page


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "block"),
    runnable_blocks(),
    ids=[f"{page}: {block.splitlines()[0][:60]}" for page, block in runnable_blocks()],
)
def test_a_runnable_block_runs_as_written(page: str, block: str, tmp_path: Path):
    for name in ("src", "conf"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**os.environ, "PATH": f"{runtime.bin_dir()}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert console_noise(done) == []  # no device inventory, tips, worker or precision advice
    if LAPTOP_CHECK in block:  # what it shows, once (not once per process)
        lines = done.stdout.splitlines()
        (run_dir,) = [line.removeprefix("lightbert: run directory: ") for line in lines if "run directory: " in line]
        assert json.loads((tmp_path / run_dir / "results.json").read_text())["global_step"] == 3
        summary = [line for line in lines if line.startswith("lightbert: pretrain: L2/H128/A2 (from scratch)")]
        assert len(summary) == 1 and "2 x cpu, strategy ddp, bf16-mixed, 3 steps" in summary[0], done.stdout
