"""Train with lightbert: `python src/train.py [group=option ...] [key=value ...]` (see README).

Thin on purpose: Hydra composes the config from conf/, `lightbert.train.train` does the work.
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from lightbert.cli import answer_completion_query, check_command_line, check_run_directory
from lightbert.errors import UserError
from lightbert.sweep import record_failed_job


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Returns the best validation metric: what a sweeper (e.g. sweep=optuna) optimises."""
    from lightbert.config_checks import check_config
    from lightbert.run_dir import check_not_running, check_output_dir

    try:
        # A command refused by these is refused in a second, before torch and Lightning load (train() checks again,
        # under the run directory's lock).
        check_config(cfg)
        check_not_running(Path(cfg.paths.output_dir))
        check_output_dir(Path(cfg.paths.output_dir), bool(cfg.get("resume", False)))
    except UserError as error:
        return refuse(error)
    # Imported here, so that --help, --cfg and a refused command stay fast.
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightbert.train import train

    try:
        return train(cfg)["best_score"]
    except SIGTERMException:
        # Lightning stopped after the current batch and LatestCheckpoint saved it; exit as a process killed by the
        # signal does (SIGTERM, or SIGINT for Ctrl-C).
        from lightbert import checkpointing

        stopped_by = checkpointing.stopped_by
        print(
            f"lightbert: stopped by {stopped_by.name}; the latest state is in "
            f"{cfg.paths.output_dir}/checkpoints/last.ckpt. Rerun the same command with resume=true to continue",
            file=sys.stderr,
        )
        sys.exit(128 + stopped_by)
    except UserError as error:
        return refuse(error)


def refuse(error: UserError) -> None:
    """One line on stderr and exit 2; in a multirun the sweep goes on with the other jobs: the summary lists this
    one with its error, and the command exits with 2 at the end (lightbert.sweep.SweepSummary), without a
    traceback."""
    print(f"lightbert: error: {error}", file=sys.stderr)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        hydra = HydraConfig.get()
        record_failed_job(Path(hydra.runtime.output_dir), error, list(hydra.overrides.task))
        return None
    sys.exit(2)


if __name__ == "__main__":
    answer_completion_query(sys.argv[1:])
    check_command_line(sys.argv[1:])
    check_run_directory(sys.argv[1:])
    main()
