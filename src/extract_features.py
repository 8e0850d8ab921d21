"""Contextual embeddings: `python src/extract_features.py init_from=... input_file=... output_file=...` (see README).

Thin on purpose: Hydra composes conf/extract_features.yaml, `lightbert.embeddings.extract_to_file` does the work.
"""

import sys

import hydra
from omegaconf import DictConfig

from lightbert.cli import check_command_line
from lightbert.errors import UserError


@hydra.main(version_base="1.3", config_path="../conf", config_name="extract_features")
def main(cfg: DictConfig) -> None:
    from lightbert.embeddings import extract_to_file  # imported here so that --help and --cfg stay fast

    try:
        path, count = extract_to_file(cfg)
    except UserError as error:
        print(f"lightbert: error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"lightbert: wrote the features of {count} line(s) to {path}")


if __name__ == "__main__":
    check_command_line(sys.argv[1:], config_name="extract_features")
    main()
