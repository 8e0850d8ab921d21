"""Shared fixtures: an isolated cache, small BERT-format corpora written by the tests, and config composition."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.models import write_hf_bert
from helpers.ner_files import NER_WORDS
from helpers.runs import write_bert_corpus


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All tokenizers, examples and the demo corpus of the test session live in one temporary cache, which the
    session's workers share (each builds what it needs once, as runs sharing ~/.cache/lightbert do)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist: the workers' temporary roots share a parent
        shared = shared.parent
    cache = shared / "lightbert-cache"
    cache.mkdir(exist_ok=True)
    os.environ["LIGHTBERT_CACHE"] = str(cache)
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return cache


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    return write_bert_corpus(tmp_path / "corpus.txt")


# One small real fine-tuning run per head (tests/helpers/finetuned_runs.py), shared by the tests of trained models.
@pytest.fixture(scope="session")
def sst2_run(tmp_path_factory: pytest.TempPathFactory):
    from helpers.finetuned_runs import glue_run

    return glue_run(tmp_path_factory.mktemp("sst2"), "sst2")


@pytest.fixture(scope="session")
def stsb_run(tmp_path_factory: pytest.TempPathFactory):
    from helpers.finetuned_runs import glue_run

    return glue_run(tmp_path_factory.mktemp("stsb"), "stsb")


@pytest.fixture(scope="session")
def squad_v2_run(tmp_path_factory: pytest.TempPathFactory):
    from helpers.finetuned_runs import squad_run

    return squad_run(tmp_path_factory.mktemp("squad_v2"), "2.0")


@pytest.fixture(scope="session")
def ner_run(tmp_path_factory: pytest.TempPathFactory):
    from helpers.finetuned_runs import ner_run

    return ner_run(tmp_path_factory.mktemp("ner"))


@pytest.fixture(scope="session")
def swag_run(tmp_path_factory: pytest.TempPathFactory):
    from helpers.finetuned_runs import swag_run

    return swag_run(tmp_path_factory.mktemp("swag"))


@pytest.fixture(scope="module")
def bert4(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("features") / "bert", num_hidden_layers=4, words=NER_WORDS)
