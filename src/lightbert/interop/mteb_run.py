"""Score an exported sentence embedding model on MTEB tasks; the results are saved beside the model.

    python -m lightbert.interop.convert to-hf outputs/embedding/runs/<run> exported/
    python -m lightbert.interop.mteb_run exported/ --tasks NFCorpus SciFact STSBenchmark      # needs the mteb extra

The model directory is a sentence-transformers directory (modules.json), as `convert to-hf` writes one for a
task=embedding run. It is loaded with `sentence_transformers.SentenceTransformer` and scored with `mteb.evaluate`,
which downloads each task's data from the Hugging Face hub. mteb's own command cannot do this: `mteb run -m exported/`
looks the name up in mteb's model registry and on the hub, finds neither for a local directory, and stops with "No
model implementation is available for this model" (mteb 2.26).

The results go to mteb's result folder under `--output` (default: `<model dir>/mteb/`), one JSON file per task with
every split's scores (`scores.<split>[0].main_score`, e.g. ndcg_at_10 for retrieval):

    <output>/results/lightbert__<model dir's name>/<revision>/<Task>.json     (and model_meta.json)

The revision is the first 12 hex digits of the SHA-256 of the model's weights, so that results of other weights never
mix with these. A task these weights already have results for is not run again and its file is left as it was
(mteb's "only-missing" strategy): delete the file to score the task again.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightbert.errors import UserError, exits_on_user_error, require_extra

COMMAND = "python -m lightbert.interop.mteb_run"
WEIGHTS = (".safetensors", ".bin")

# Tasks by name that mteb's registry does not hold, looked up before it: the tests put small local tasks here.
LOCAL_TASKS: dict[str, Any] = {}


def check_model_dir(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: no such directory")
    if not (model_dir / "modules.json").is_file():
        raise UserError(
            f"{model_dir} is not a sentence-transformers model (no modules.json): export a task=embedding run with "
            "python -m lightbert.interop.convert to-hf <run dir> <out dir>"
        )


def weights_revision(model_dir: Path, output: Path) -> str:
    """The first 12 hex digits of the SHA-256 of the model's weight files (names and contents, in name order)."""
    output = output.resolve()
    digest = hashlib.sha256()
    for file in sorted(model_dir.resolve().rglob("*")):
        if file.suffix in WEIGHTS and file.is_file() and output not in file.parents:
            digest.update(str(file.relative_to(model_dir.resolve())).encode())
            with file.open("rb") as f:
                for block in iter(lambda f=f: f.read(1 << 24), b""):
                    digest.update(block)
    return digest.hexdigest()[:12]


def mteb_tasks(names: Sequence[str]) -> list:
    import mteb

    unknown = [name for name in names if name not in LOCAL_TASKS]
    try:
        found = {task.metadata.name: task for task in mteb.get_tasks(tasks=unknown)} if unknown else {}
    except KeyError as error:  # "KeyError: 'Nope' not found and no similar keys were found."
        message = str(error.args[0]).removeprefix("KeyError: ")
        raise UserError(f"no such MTEB task: {message} (mteb available-tasks lists them)") from None
    return [LOCAL_TASKS[name] if name in LOCAL_TASKS else found[name] for name in names]


def run_mteb(
    model_dir: str | Path,
    tasks: Sequence[str],
    output: str | Path | None = None,
    batch_size: int = 32,
    device: str | None = None,
) -> dict[str, Path]:
    """Scores the model on `tasks` (MTEB task names) and returns each task's result file."""
    model_dir = Path(model_dir).expanduser()
    check_model_dir(model_dir)
    require_extra("mteb", COMMAND)
    output = model_dir / "mteb" if output is None else Path(output).expanduser()
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output} is a file, not a directory")
    selected = mteb_tasks(tasks)

    import mteb
    from mteb.models import SentenceTransformerEncoderWrapper
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformerEncoderWrapper(SentenceTransformer(str(model_dir), device=device))
    name = f"lightbert/{model_dir.resolve().name}"
    model.mteb_model_meta = model.mteb_model_meta.model_copy(
        update={"name": name, "revision": weights_revision(model_dir, output)}
    )
    cache = mteb.ResultCache(output)
    files = {
        task.metadata.name: cache.get_task_result_path(task.metadata.name, model.mteb_model_meta) for task in selected
    }
    before = {task: file.stat().st_mtime_ns for task, file in files.items() if file.is_file()}
    try:
        results = mteb.evaluate(
            model,
            selected,
            cache=cache,
            overwrite_strategy="only-missing",
            encode_kwargs={"batch_size": batch_size},
            show_progress_bar=False,
        )
    except ConnectionError as error:  # datasets': "Couldn't reach 'mteb/scifact' on the Hub (...)"
        raise UserError(f"{error}: mteb downloads each task's data from the Hugging Face hub") from None
    for result in results.task_results:
        file = files[result.task_name]
        kept = " (kept from an earlier run)" if before.get(result.task_name) == file.stat().st_mtime_ns else ""
        print(f"lightbert: {result.task_name}: {result.main_score:.4f}{kept} in {file}")
    return files


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="a sentence-transformers directory (convert to-hf of a task=embedding run)")
    parser.add_argument("--tasks", nargs="+", required=True, metavar="TASK", help="MTEB task names, e.g. NFCorpus")
    parser.add_argument("--output", help="where mteb's results/ folder goes (default: <model dir>/mteb)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default: 32)")
    parser.add_argument("--device", help="e.g. cuda, cuda:1, cpu (default: a GPU if there is one)")
    args = parser.parse_args(argv)
    run_mteb(args.model_dir, args.tasks, args.output, args.batch_size, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
