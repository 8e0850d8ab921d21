"""The docs site builds as CI builds it: `mkdocs build --strict`, where a broken link or #anchor, a page missing from
the nav or a moved include (bench/RESULTS.md, README.md's sections) is an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runs import REPO

pytest.importorskip("mkdocs", reason="the docs build needs the dev extra's mkdocs")
pytest.importorskip("material", reason="the docs build needs the dev extra's mkdocs-material")


def test_the_docs_build_strictly_without_a_warning(tmp_path: Path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,  # the snippets' base path: the repository root
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about MkDocs 2, not a build warning
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr, built.stderr[-3000:]
    # The pages pulled in from outside docs/ arrived with their text, not empty.
    results = (tmp_path / "site" / "benchmark-results" / "index.html").read_text(encoding="utf-8")
    assert "GPU: the first measurements" in results
    started = (tmp_path / "site" / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert "lightbert-train" in started and "8&lt;" not in started  # README's install section, its markers gone
