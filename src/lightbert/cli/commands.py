"""The commands: `python src/train.py`, `src/evaluate.py`, `src/predict.py` and `src/extract_features.py` in a
checkout, `lightbert-train`, `lightbert-evaluate`, `lightbert-predict` and `lightbert-extract-features` when
installed. Each composes its config from conf/ (shipped in the package), checks the command line before Hydra does,
and hands the work to one function; a `UserError` anywhere ends it with one line and exit 2
(`lightbert.errors.exits_on_user_error`).

Heavy imports (torch, Lightning) happen inside the task functions, so that --help, --cfg and a refused command stay
fast.
"""

from __future__ import annotations

import atexit
import gc
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from lightbert.cli.checks import check_command_line, check_run_directory
from lightbert.cli.completion import answer_completion_query
from lightbert.errors import UserError, exits_on_user_error, message_of
from lightbert.run.configs import CONF_DIR


def _record_in_sweep(error: UserError) -> bool:
    """In a multirun a refused job does not end the sweep: the summary lists it with its error, and the command
    exits with 2 at the end (lightbert.analysis.sweep.SweepSummary)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    from lightbert.analysis.sweep import record_failed_job

    print(f"lightbert: error: {message_of(error)}", file=sys.stderr)
    hydra_config = HydraConfig.get()
    record_failed_job(Path(hydra_config.runtime.output_dir), error, list(hydra_config.overrides.task))
    return True


def _train(cfg: DictConfig) -> float | None:
    """Returns the best validation metric: what a sweeper (e.g. sweep=optuna) optimises."""
    from lightbert.run.train import train

    return train(cfg)["best_score"]


def _evaluate(cfg: DictConfig) -> None:
    from lightbert.run.evaluate import evaluate

    evaluate(cfg)


def _predict(cfg: DictConfig) -> None:
    from lightbert.inference.predict import predict_to_file

    predict_to_file(cfg)


def _extract_features(cfg: DictConfig) -> None:
    from lightbert.inference.embeddings import extract_to_file

    path, count = extract_to_file(cfg)
    print(f"lightbert: wrote the features of {count} line(s) to {path}")


def _hydra_command(task, config_name: str, on_refusal=None):
    return hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)(
        exits_on_user_error(task, on_refusal)
    )


@exits_on_user_error
def _check_before_hydra(argv: list[str], config_name: str, run_directory: bool = True) -> None:
    """The command line's keys and options, and the run directory Hydra would make, judged before Hydra runs; not
    again in a DDP process the first one launched, which judged this same command line (a composition saved)."""
    from lightbert.cluster.processes import launched_by_another

    if launched_by_another():
        return
    check_command_line(argv, config_name=config_name)
    if run_directory:
        check_run_directory(argv)


def _exit_without_collecting_the_heap() -> None:
    """The command's last exit handler (registered first, it runs last): the garbage the command left is collected
    here, once, as the interpreter's exit would (finalizers run, files flush); then every live object is frozen out
    of the collector's reach. Left to the interpreter, its exit collected again as it tore the modules down, over
    the half a million objects that torch, Lightning and Hydra hold: measured, 1.5 to 2.3 CPU-s and 4 to 14 s of
    wall time after a `python src/train.py` had finished (a DDP process, its line said, took as long to end), 0.4
    CPU-s with this. Freed by the exit itself, as every process's memory is."""
    gc.collect()
    gc.freeze()


def _ends_quickly() -> None:
    atexit.register(_exit_without_collecting_the_heap)


def train_command() -> None:
    from lightbert.cluster.processes import adopt_launch, ddp_child_argv

    _ends_quickly()
    adopt_launch()  # first: a DDP process the first one launched leaves Ctrl-C to it
    sys.argv[1:] = argv = ddp_child_argv(sys.argv[1:])  # a multirun job's DDP process runs that job alone
    answer_completion_query(argv)
    _check_before_hydra(argv, "train")
    _hydra_command(_train, "train", on_refusal=_record_in_sweep)()


def evaluate_command() -> None:
    from lightbert.cluster.processes import adopt_launch, ddp_child_argv

    _ends_quickly()
    adopt_launch()
    sys.argv[1:] = ddp_child_argv(sys.argv[1:])
    _check_before_hydra(sys.argv[1:], "evaluate")
    _hydra_command(_evaluate, "evaluate")()


def predict_command() -> None:
    _ends_quickly()
    _check_before_hydra(sys.argv[1:], "predict", run_directory=False)
    _hydra_command(_predict, "predict")()


def extract_features_command() -> None:
    _ends_quickly()
    _check_before_hydra(sys.argv[1:], "extract_features", run_directory=False)
    _hydra_command(_extract_features, "extract_features")()
