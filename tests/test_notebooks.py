"""Every notebook executes top to bottom on a CPU (so none rots), and is committed without outputs (nbstripout)."""

from __future__ import annotations

import os

import nbformat
import pytest
from helpers.runs import REPO
from nbclient import NotebookClient

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_the_three_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["01_pretraining_data.ipynb", "02_sweep_results.ipynb", "03_attention.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: run nbstripout (pre-commit)"


@pytest.fixture(scope="module")
def notebook_dir(tmp_path_factory):
    """One working directory for the notebooks of this session: 03 reuses the checkpoint 01 pre-trained."""
    directory = tmp_path_factory.mktemp("notebooks")
    previous = os.environ.get("LIGHTBERT_NOTEBOOK_DIR")
    os.environ["LIGHTBERT_NOTEBOOK_DIR"] = str(directory)  # the kernel inherits this process's environment
    yield directory
    if previous is None:
        del os.environ["LIGHTBERT_NOTEBOOK_DIR"]
    else:
        os.environ["LIGHTBERT_NOTEBOOK_DIR"] = previous


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, notebook_dir):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert figures, f"{path.name} drew no figure"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    expected = {
        "01_pretraining_data": ["IsNext", "chosen:", "top-3 predictions", "MLM accuracy on this batch"],
        "02_sweep_results": ["swept: ['optim.lr', 'task.batch_size']", "-> best val/loss", "over 2 seeds"],
        "03_attention": ["within its own segment"],
    }[path.stem]
    for line in expected:
        assert line in text, f"{path.name}: {line!r} not in its output"
    # Clean output: no terminal colour codes (Lightning's rich tables) and no tqdm warning about ipywidgets
    assert "\x1b[" not in text and "TqdmWarning" not in text, text[:3000]
