"""Shared fixtures: an isolated cache, small BERT-format corpora written by the tests, and config composition."""

from __future__ import annotations

import gc
import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from helpers import runtime
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
    os.environ[runtime.LOCATION_VARIABLE] = str(shared / "lightbert-runtime")  # made on first use
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Every process a test starts (scripts, DDP and FSDP ranks, torchrun's) prints its Python stack on a fatal
    # signal (SIGSEGV, SIGABRT, ...) to the stderr the test reports: a crash seen once comes with where it was.
    os.environ["PYTHONFAULTHANDLER"] = "1"
    share_the_cores()
    return cache


def share_the_cores() -> None:
    """Under pytest-xdist, each worker's torch (and every process it starts) uses its share of the cores. torch
    otherwise starts one thread per core in each process, and OpenMP threads that outnumber the cores wait for each
    other: measured on 2 cores with 2 workers, a 4.6 s SWAG fine-tuning test took 147 s."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)  # the cores this process may run on
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the processes the tests start: scripts, DDP ranks, kernels


# The files that take longest, longest first (measured with `pytest --durations=0` on 2 cores): xdist hands out whole
# files (`--dist loadfile`, so that a file's module fixtures are built once), in collection order
# (`--no-loadscope-reorder`: by default it orders them by their number of tests instead), to whichever worker is free;
# a long file handed out last keeps one worker busy long after the other has finished. The other files follow
# in their usual order. A name missing here only runs later; a stale order costs minutes, not correctness.
LONGEST_FIRST = (
    "test_processes.py", "test_bench.py", "test_trainers.py", "test_notebooks.py", "test_train.py", "test_resume.py",
    "test_fsdp.py", "test_readme.py", "test_bad_input.py", "test_gpu_check.py", "test_preemption.py",
    "test_multinode.py", "test_benchmark.py", "test_export.py", "test_cluster.py", "test_silent_round6.py",
    "test_run_record.py", "test_sweep.py", "test_glue.py", "test_packaging.py", "test_config.py",
    "test_elastic_resume.py", "test_squad.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (`LONGEST_FIRST`); within a file, the tests keep their order."""
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module imported (torch, Lightning, transformers, sentence-transformers: ~0.7M objects), collected
    once and frozen: the tests that train in this process otherwise pay for full collections that walk them all
    (measured on test_config, test_glue and test_modern in one process, `-n 0`: 5.8 s in the collector of ~51
    CPU-s, 3.9 s with the freeze)."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's garbage collected once, then every live object frozen: the interpreter's exit would otherwise
    collect again over the millions of objects a worker holds (torch, Lightning, transformers), while the session
    waits for its workers to end (measured: 1.5 CPU-s less per pytest process)."""
    gc.collect()
    gc.freeze()


# The process state a test could leave to the next test of its worker, and whose handlers and settings are checked here.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "lightbert")  # the root's are pytest's


@pytest.fixture(autouse=True)
def process_state():
    """Each test starts from the state the worker had before it: the tests that call `lightbert.train` in this
    process (as a notebook does) leave nothing to the next. Measured: two runs in a row leave the working directory,
    torch's threads, the default dtype, the deterministic flags and the signal handlers as they were, but the first
    leaves Lightning's variables (PL_GLOBAL_SEED, PL_SEED_WORKERS, read by the next seed and DataLoader) and its
    loggers' handlers; a test may also change any of these itself. pytest restores the warning filters."""
    cwd, env = os.getcwd(), dict(os.environ)
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    handlers = {signum: signal.getsignal(signum) for signum in SIGNALS}
    loggers = {name: (list(logging.getLogger(name).handlers), logging.getLogger(name).level) for name in LOGGERS}
    yield
    os.chdir(cwd)
    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            signal.signal(signum, handler)
    for name, (kept, level) in loggers.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = kept
        logger.setLevel(level)


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
