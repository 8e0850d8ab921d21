"""Contextual embeddings: `python src/extract_features.py init_from=... input_file=... output_file=...`
(see docs/using-a-model.md).

Thin on purpose: `lightbert.cli.commands` composes the config from conf/ and runs the job; an installed lightbert
runs the same as `lightbert-extract-features`.
"""

from lightbert.cli.commands import extract_features_command

if __name__ == "__main__":
    extract_features_command()
