"""Task data from local files, one per split (`task.data_files.<split>=PATH`), and from the Hugging Face hub."""

from __future__ import annotations

import csv
from pathlib import Path

import datasets

from lightbert.errors import UserError

LOCAL_FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def check_data_files(data_files: dict[str, str], required: tuple[str, ...], known: tuple[str, ...], task: str) -> None:
    """Every required split has a file, every split is known, every file exists in a format we read."""
    if not data_files:
        return
    unknown = sorted(set(data_files) - set(known))
    if unknown:
        raise UserError(f"task.data_files has unknown split(s) {unknown} for {task}; valid: {list(known)}")
    missing = [s for s in required if s not in data_files]
    if missing:
        raise UserError(
            f"task.data_files gives no file for the split(s) {missing}; {task} needs "
            + ", ".join(f"task.data_files.{s}=PATH" for s in required)
        )
    for split, path in data_files.items():
        file = Path(path).expanduser()
        if not file.is_file():
            raise UserError(f"task.data_files.{split}: {file} does not exist")
        if file.suffix.lower() not in LOCAL_FORMATS:
            formats = sorted(LOCAL_FORMATS)
            raise UserError(f"task.data_files.{split}: {file} has an unknown format; use one of {formats}")


def read_local(file: Path, cache_dir: Path, where: str) -> datasets.Dataset:
    """One file as a Dataset, by its extension (csv, tsv, json, jsonl, parquet)."""
    suffix = file.suffix.lower()
    # Task text is full of quotes: read TSV cells verbatim, as the GLUE distribution's own readers do.
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if suffix == ".tsv" else {}
    try:
        return datasets.load_dataset(
            LOCAL_FORMATS[suffix],
            data_files={"data": str(file)},
            split="data",
            cache_dir=str(cache_dir / "datasets"),
            **options,
        )
    except Exception as error:
        raise UserError(f"could not read {where}: {error}") from None


def read_hub(name: str, config: str | None, split: str, required: tuple[str, ...], where: str) -> datasets.Dataset:
    """`where` names the source in messages; `required` lists the splits a user would give as local files."""
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as error:
        raise UserError(
            f"could not load {where} from the Hugging Face hub ({type(error).__name__}); without a network, "
            "give local files: " + ", ".join(f"task.data_files.{s}=PATH" for s in required)
        ) from None
