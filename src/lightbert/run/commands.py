"""The commands: `python src/train.py`, `src/evaluate.py`, `src/predict.py` and `src/extract_features.py` in a
checkout, `lightbert-train`, `lightbert-evaluate`, `lightbert-predict` and `lightbert-extract-features` when
installed. Each composes its config from conf/ (shipped in the package), checks the command line before Hydra does,
and hands the work to one function; a `UserError` anywhere ends it with one line and exit 2
(`lightbert.errors.exits_on_user_error`).

Heavy imports (torch, Lightning) happen inside the task functions, so that --help, --cfg and a refused command stay
fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from lightbert.errors import UserError, exits_on_user_error
from lightbert.run.cli import CONF_DIR, answer_completion_query, check_command_line, check_run_directory


def _record_in_sweep(error: UserError) -> bool:
    """In a multirun a refused job does not end the sweep: the summary lists it with its error, and the command
    exits with 2 at the end (lightbert.analysis.sweep.SweepSummary)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    from lightbert.analysis.sweep import record_failed_job

    print(f"lightbert: error: {error}", file=sys.stderr)
    hydra_config = HydraConfig.get()
    record_failed_job(Path(hydra_config.runtime.output_dir), error, list(hydra_config.overrides.task))
    return True


def _refuse_before_loading(cfg: DictConfig, resume: bool) -> None:
    """A command refused by these is refused in a second, before torch and Lightning load (the job checks again,
    under the run directory's lock)."""
    from lightbert.run.config_checks import check_config
    from lightbert.run.run_dir import check_not_running, check_output_dir, requeued

    check_config(cfg)
    check_not_running(Path(cfg.paths.output_dir))
    check_output_dir(Path(cfg.paths.output_dir), resume or requeued(Path(cfg.paths.output_dir)))


def _train(cfg: DictConfig) -> float | None:
    """Returns the best validation metric: what a sweeper (e.g. sweep=optuna) optimises."""
    from lightbert.run.cluster import adopt_submitit_local_ranks

    adopt_submitit_local_ranks()  # before anything asks which process this is
    _refuse_before_loading(cfg, bool(cfg.get("resume", False)))
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightbert.run import checkpointing, processes
    from lightbert.run.jobs import train

    try:
        with processes.stops_cleanly(cfg.paths.output_dir):
            return train(cfg)["best_score"]
    except SIGTERMException:
        # Lightning stopped after the current batch and LatestCheckpoint saved it; exit as a process killed by the
        # signal does (SIGTERM, or SIGINT for Ctrl-C).
        stopped_by = checkpointing.stopped_by
        print(
            f"lightbert: stopped by {stopped_by.name}; the latest state is in "
            f"{cfg.paths.output_dir}/checkpoints/last.ckpt. To continue, rerun the same command with "
            f"hydra.run.dir={cfg.paths.output_dir} resume=true",
            file=sys.stderr,
        )
        sys.exit(128 + stopped_by)


def _evaluate(cfg: DictConfig) -> None:
    from lightbert.run.cluster import adopt_submitit_local_ranks

    adopt_submitit_local_ranks()
    _refuse_before_loading(cfg, resume=False)
    from lightbert.run.jobs import evaluate

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


def train_command() -> None:
    from lightbert.run.processes import ddp_child_argv

    sys.argv[1:] = argv = ddp_child_argv(sys.argv[1:])  # a multirun job's DDP process runs that job alone
    answer_completion_query(argv)
    check_command_line(argv)
    check_run_directory(argv)
    _hydra_command(_train, "train", on_refusal=_record_in_sweep)()


def evaluate_command() -> None:
    from lightbert.run.processes import ddp_child_argv

    sys.argv[1:] = ddp_child_argv(sys.argv[1:])
    check_command_line(sys.argv[1:], config_name="evaluate")
    check_run_directory(sys.argv[1:])
    _hydra_command(_evaluate, "evaluate")()


def predict_command() -> None:
    check_command_line(sys.argv[1:], config_name="predict")
    _hydra_command(_predict, "predict")()


def extract_features_command() -> None:
    check_command_line(sys.argv[1:], config_name="extract_features")
    _hydra_command(_extract_features, "extract_features")()
