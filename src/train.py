"""Train with lightbert: `python src/train.py [group=option ...] [key=value ...]` (see README).

Thin on purpose: Hydra composes the config from conf/, `lightbert.train.train` does the work.
"""

import sys

import hydra
from omegaconf import DictConfig

from lightbert.cli import check_command_line
from lightbert.errors import UserError


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from lightbert.train import train  # imported here so that --help and --cfg stay fast

    try:
        train(cfg)
    except UserError as error:
        print(f"lightbert: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
