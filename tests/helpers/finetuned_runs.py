"""Small real fine-tuning runs, one per head, that the tests of trained models (predict, evaluate, exports) share.

Each is `python src/train.py`'s own `train()` on files in the task's schema, a few steps long: what they test is
that a trained model gives the same answers everywhere it goes, not that it learnt much.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from helpers.glue_files import glue_data_files
from helpers.models import write_hf_bert
from helpers.ner_files import FILLER, NAMES, ner_data_files
from helpers.runs import compose_config
from helpers.squad_files import squad_data_files
from helpers.swag_files import ACTIONS, SUBJECTS, swag_data_files
from lightbert import train

NER_WORDS = FILLER + " ".join(n for names in NAMES.values() for n in names).split()
COMMON = ["trainer=cpu", "logger=csv", "task.datamodule.num_workers=0", "trainer.max_steps=-1"]


@dataclass
class Run:
    task: str
    dir: Path
    files: dict[str, Path]
    results: dict
    overrides: list[str]


def fine_tune(root: Path, task: str, files: dict, bert: Path, extra: list[str]) -> Run:
    overrides = [f"task={task}", f"init_from={bert}", *COMMON, *extra]
    overrides += [f"task.data_files.{split}={path}" for split, path in files.items()]
    results = train(compose_config(overrides, root / "run"))
    return Run(task, root / "run", files, results, overrides)


def glue_run(root: Path, task: str = "sst2") -> Run:
    files = glue_data_files(root / "data", task, "jsonl", num_rows=48)
    bert = write_hf_bert(root / "bert")
    extra = ["task.batch_size=8", "task.max_seq_length=32", "trainer.max_epochs=2", "optim.lr=1e-3"]
    return fine_tune(root, f"glue/{task}", files, bert, extra)


def squad_run(root: Path, version: str = "2.0") -> Run:
    files = squad_data_files(root / "data", version, fmt="jsonl")
    bert = write_hf_bert(root / "bert")
    extra = [
        "task.batch_size=8",
        "task.max_seq_length=64",
        "task.doc_stride=16",
        "task.max_query_length=16",
        "trainer.max_epochs=2",
        "optim.lr=1e-3",
    ]
    return fine_tune(root, f"squad_v{version[0]}", files, bert, extra)


def ner_run(root: Path) -> Run:
    files = ner_data_files(root / "data", fmt="jsonl", sizes=(64, 24, 24))
    bert = write_hf_bert(root / "bert", words=NER_WORDS)
    return fine_tune(root, "conll2003", files, bert, ["task.batch_size=8", "trainer.max_epochs=2", "optim.lr=1e-3"])


def swag_run(root: Path) -> Run:
    files = swag_data_files(root / "data", "jsonl", sizes=(64, 24))
    bert = write_hf_bert(root / "bert", words=" ".join(SUBJECTS + ACTIONS).split())
    return fine_tune(root, "swag", files, bert, ["task.batch_size=8", "trainer.max_epochs=2", "optim.lr=1e-3"])
