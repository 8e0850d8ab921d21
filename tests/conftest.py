"""Shared fixtures: an isolated cache, small BERT-format corpora written by the tests, and config composition."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from lightbert.run.jobs import compose_config as lightbert_compose_config

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"

# Common English words: the synthetic corpora are random sentences of these.
WORDS = """
the of and to in is was for on that by with as at from his her are were be this which have or an had not but
their they one its new after first also been has who two more other into all time when some would there can
city year state world school people part music team river war album film series party house game called
""".split()


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All tokenizers, examples and the demo corpus of the test session live in one temporary cache."""
    cache = tmp_path_factory.mktemp("lightbert-cache")
    os.environ["LIGHTBERT_CACHE"] = str(cache)
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return cache


def write_bert_corpus(path: Path, num_documents: int = 40, seed: int = 0) -> Path:
    """A BERT-format file: `num_documents` documents of 4-12 English-looking sentences, one per line."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_documents):
        for _ in range(rng.randint(4, 12)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(5, 18))]
            lines.append(" ".join(words).capitalize() + ".")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    return write_bert_corpus(tmp_path / "corpus.txt")


# A pre-training run of seconds on a corpus=text file (add corpus.paths=[...]): what the fault tests run for real.
TINY_PRETRAIN = [
    "model=bert_tiny",
    "trainer=cpu",
    "task.batch_size=4",
    "task.max_seq_length=64",
    "task.datamodule.vocab_size=400",
    "task.datamodule.dupe_factor=1",
    "task.datamodule.num_workers=0",
    "logger=csv",
    "corpus=text",
]


def compose_config(overrides: list[str], output_dir: Path) -> DictConfig:
    """The config `python src/train.py OVERRIDES` would run, with its run directory at `output_dir`."""
    return lightbert_compose_config(overrides, output_dir, CONF_DIR)


def default_sigint() -> None:
    """For a child that must take Ctrl-C: a non-interactive shell starts background jobs with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_train_script(
    *args: str, cwd: Path = REPO, start_new_session: bool = False, **env: str
) -> subprocess.CompletedProcess:
    """`python src/train.py ARGS` in a subprocess, as a user would run it (SIGINT as in a terminal's foreground);
    `env` adds environment variables."""
    return subprocess.run(
        [sys.executable, str(REPO / "src" / "train.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, **env},
        start_new_session=start_new_session,
        preexec_fn=default_sigint,
    )


# One small real fine-tuning run per head (tests/finetuned_runs.py), shared by the tests of trained models.
@pytest.fixture(scope="session")
def sst2_run(tmp_path_factory: pytest.TempPathFactory):
    from finetuned_runs import glue_run

    return glue_run(tmp_path_factory.mktemp("sst2"), "sst2")


@pytest.fixture(scope="session")
def stsb_run(tmp_path_factory: pytest.TempPathFactory):
    from finetuned_runs import glue_run

    return glue_run(tmp_path_factory.mktemp("stsb"), "stsb")


@pytest.fixture(scope="session")
def squad_v2_run(tmp_path_factory: pytest.TempPathFactory):
    from finetuned_runs import squad_run

    return squad_run(tmp_path_factory.mktemp("squad_v2"), "2.0")


@pytest.fixture(scope="session")
def ner_run(tmp_path_factory: pytest.TempPathFactory):
    from finetuned_runs import ner_run

    return ner_run(tmp_path_factory.mktemp("ner"))


@pytest.fixture(scope="session")
def swag_run(tmp_path_factory: pytest.TempPathFactory):
    from finetuned_runs import swag_run

    return swag_run(tmp_path_factory.mktemp("swag"))
