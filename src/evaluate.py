"""Evaluate a fine-tuned model without training: `python src/evaluate.py task=... init_from=...` (see README).

Thin on purpose: Hydra composes conf/evaluate.yaml (train.yaml with init_from required and runs under
outputs/<task>/evals/), `lightbert.train.evaluate` does the work.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from lightbert.cli import check_command_line, check_run_directory
from lightbert.errors import UserError


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from lightbert.config_checks import check_config
    from lightbert.run_dir import check_not_running, check_output_dir

    try:
        check_config(cfg)  # refused in a second, before torch and Lightning load
        check_not_running(Path(cfg.paths.output_dir))
        check_output_dir(Path(cfg.paths.output_dir), resume=False)
        from lightbert.train import evaluate

        evaluate(cfg)
    except UserError as error:
        print(f"lightbert: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_command_line(sys.argv[1:], config_name="evaluate")
    check_run_directory(sys.argv[1:])
    main()
