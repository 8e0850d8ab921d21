"""An installed lightbert runs outside a checkout: the wheel carries conf/, and `lightbert-train` composes from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import runtime
from helpers.runs import REPO


def test_the_wheel_carries_every_config_file(built_wheel: Path):
    with zipfile.ZipFile(built_wheel) as wheel:
        packaged = {name.removeprefix("lightbert/conf/") for name in wheel.namelist() if name.startswith("lightbert/")}
    in_checkout = {str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").rglob("*.yaml")}
    assert in_checkout <= packaged


def test_the_wheel_carries_the_benchmark_sweeper_and_leaves_hydras_plugin_namespace_open(built_wheel: Path):
    with zipfile.ZipFile(built_wheel) as wheel:
        plugins = {name for name in wheel.namelist() if name.startswith("hydra_plugins/")}
    assert "hydra_plugins/lightbert_benchmark/benchmark_sweeper.py" in plugins
    assert "hydra_plugins/__init__.py" not in plugins  # it would hide the optuna and submitit plugins


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of what the package is made of: pip builds in the source tree, and the
    checkout keeps no build/ of the test's."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for part in ("src", "conf"):
        shutil.copytree(
            REPO / part, source / part, symlinks=True, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("lightbert-*.whl")
    return wheel


@pytest.mark.slow
def test_an_installed_wheel_trains_from_any_directory(built_wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The new environment sees this one's dependencies (torch, Lightning, ...) but not its editable lightbert: the
    # paths of a .pth line are added as they are, and their own .pth files (the editable finder) are not read.
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())  # fmt: skip
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", built_wheel],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.check_output([python, "-c", "import lightbert; print(lightbert.__file__)"], cwd=elsewhere,
                                    env=env, text=True)  # fmt: skip
    assert where.startswith(str(site)), where  # the wheel's copy, not the checkout's

    command = venv / "bin" / "lightbert-train"
    help_page = subprocess.run([command, "--help"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert help_page.returncode == 0 and "model=" in help_page.stdout
    typo = subprocess.run([command, "model=bert_tinyy"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert typo.returncode == 2 and "Did you mean model=bert_tiny?" in typo.stderr  # the same checks as src/train.py

    train = [command, "model=bert_tiny", "trainer=cpu", "trainer.max_steps=3", "logger=csv", "task.batch_size=8"]
    run = subprocess.run(
        [*train, "task.datamodule.num_workers=0"],  # 3 steps: loader processes are not what this checks
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (results_file,) = (elsewhere / "outputs").rglob("results.json")  # under the working directory, as documented
    assert json.loads(results_file.read_text())["global_step"] == 3


def test_the_pre_commit_hooks_find_the_tools_of_the_active_venv_wherever_it_is(tmp_path):
    """The hooks are not tied to ./.venv: .ci/venv-tool takes $VIRTUAL_ENV's tool first, and names what is missing."""
    fake = tmp_path / "elsewhere" / "bin"
    fake.mkdir(parents=True)
    (fake / "ruff").write_text('#!/bin/sh\necho "the active venv\'s ruff" "$@"\n')
    (fake / "ruff").chmod(0o755)
    tool = str(REPO / ".ci" / "venv-tool")
    env = {**os.environ, "VIRTUAL_ENV": str(fake.parent)}
    done = subprocess.run([tool, "ruff", "check"], cwd=REPO, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "the active venv's ruff check\n")
    env = {**os.environ, "VIRTUAL_ENV": str(fake.parent), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([tool, "no-such-tool"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "pre-commit: no-such-tool not found" in done.stderr


# Every module of lightbert, imported in a fresh interpreter; prints the suite's references that got imported.
IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import hydra_plugins.lightbert_benchmark.benchmark_sweeper
import lightbert
for module in pkgutil.walk_packages(lightbert.__path__, "lightbert."):
    importlib.import_module(module.name)
print(sorted(name for name in ("transformers", "sklearn", "scipy", "seqeval", "matplotlib") if name in sys.modules))
"""


@pytest.mark.slow
def test_every_module_imports_on_an_install_of_lightberts_declared_dependencies():
    """On `helpers.runtime` (lightbert[slurm,onnx,fp8] and what it requires, not the dev extra's references): a
    module that imported transformers, scikit-learn or SciPy would fail a user's `pip install lightbert` here."""
    result = subprocess.run([runtime.python(), "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
    missing = subprocess.run([runtime.python(), "-c", "import transformers"], capture_output=True, text=True)
    assert "No module named 'transformers'" in missing.stderr  # the references are not there to be imported
