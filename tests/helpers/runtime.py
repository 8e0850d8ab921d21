"""The Python a user's install of lightbert runs on: its declared dependencies, without the suite's own packages.

The dev extra installs what the tests compare against (transformers, scikit-learn, SciPy, seqeval, matplotlib,
...). A command the tests start with this venv's Python sees them all, and pays for them: torchmetrics, which
Lightning imports at start-up, imports transformers, `scipy.signal` and matplotlib whenever they are installed
(measured: 6.3 s to import what `src/train.py` imports here, 4.2 s without them). No lightbert module imports a
reference package, and nothing but this would notice one that did.

`python()` is a second virtual environment, made once per test session beside its shared cache: its site-packages
holds links to the installed files of `lightbert[slurm,onnx,fp8]` and what they require, nothing else. The extras
left out are the two that bring in a package torchmetrics imports unasked (`optuna` requires SciPy, `report` is
matplotlib); a test that starts a command needing them uses `sys.executable`, as do the benchmarks (they compare
with transformers) and the notebooks. Its bin/ has lightbert's commands too (`lightbert-train`, ...): the README's
blocks run there, as after the README's `pip install -e .`.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.metadata
import os
import sysconfig
import venv
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

EXTRAS = ("slurm", "onnx", "fp8")
LOCATION_VARIABLE = "LIGHTBERT_TEST_RUNTIME"  # set by conftest's session fixture: where the environment is made


def python() -> str:
    """The environment's interpreter."""
    return str(bin_dir() / "python")


@functools.cache
def bin_dir() -> Path:
    """The environment's bin/ (`python`, and lightbert's commands as pip writes them), made on first use: once for
    all of a session's workers (each asks once)."""
    where = Path(os.environ[LOCATION_VARIABLE])
    with open(f"{where}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for the first to finish making it
        if not (where / "made").is_file():
            make(where)
            (where / "made").touch()
    return where / "bin"


def make(where: Path) -> None:
    venv.EnvBuilder(symlinks=True, with_pip=False, clear=True).create(where)
    source = Path(sysconfig.get_paths()["purelib"])
    target = Path(sysconfig.get_paths(vars={"base": str(where), "platbase": str(where)})["purelib"])
    wanted = set(installed_requirements(f"lightbert[{','.join(EXTRAS)}]"))
    if "lightbert" not in wanted:
        raise RuntimeError("lightbert is not installed in the venv that runs the tests: pip install -e '.[dev]'")
    owners: dict[Path, set[str]] = {}  # each file or folder at the top of site-packages, and who installed it
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if parts and parts[0] != "..":
                owners.setdefault(Path(parts[0]), set()).add(name)
                if len(parts) > 1:  # a folder that several distributions share (hydra_plugins/, google/, ...)
                    owners.setdefault(Path(parts[0], parts[1]), set()).add(name)
    for entry, names in sorted(owners.items()):
        shared_top = len(owners.get(Path(entry.parts[0]), ())) > 1
        if len(entry.parts) == 1 and not shared_top and names & wanted and (source / entry).exists():
            (target / entry).symlink_to(source / entry)
        elif len(entry.parts) == 2 and shared_top and names & wanted and (source / entry).exists():
            (target / entry.parts[0]).mkdir(exist_ok=True)
            (target / entry).symlink_to(source / entry)
    for command in importlib.metadata.distribution("lightbert").entry_points.select(group="console_scripts"):
        script = where / "bin" / command.name
        module, _, function = command.value.partition(":")
        script.write_text(
            f"#!{where / 'bin' / 'python'}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
        )
        script.chmod(0o755)


def installed_requirements(requirement: str) -> list[str]:
    """The installed distributions `pip install REQUIREMENT` would install: it, and what it requires (with the
    extras asked for), transitively; normalized names."""
    found: dict[str, set[str]] = {}
    pending = [Requirement(requirement)]
    while pending:
        wanted = pending.pop()
        name = canonicalize_name(wanted.name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement of another platform, or optional and not installed
        if name in found and set(wanted.extras) <= found[name]:
            continue
        found.setdefault(name, set()).update(wanted.extras)
        for line in dist.requires or []:
            needed = Requirement(line)
            extras = found[name] or {""}
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras):
                pending.append(needed)
    return sorted(found)
