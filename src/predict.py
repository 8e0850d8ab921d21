"""Predictions of a fine-tuned model: `python src/predict.py init_from=... input_file=... output_file=...` (README).

Thin on purpose: Hydra composes conf/predict.yaml, `lightbert.predict.predict_to_file` does the work.
"""

import sys

import hydra
from omegaconf import DictConfig

from lightbert.cli import check_command_line
from lightbert.errors import UserError


@hydra.main(version_base="1.3", config_path="../conf", config_name="predict")
def main(cfg: DictConfig) -> None:
    from lightbert.predict import predict_to_file  # imported here so that --help and --cfg stay fast

    try:
        predict_to_file(cfg)
    except UserError as error:
        print(f"lightbert: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_command_line(sys.argv[1:], config_name="predict")
    main()
