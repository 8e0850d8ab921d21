"""Evaluate a fine-tuned model without training: `python src/evaluate.py task=... init_from=...`
(see docs/using-a-model.md).

Thin on purpose: `lightbert.cli.commands` composes the config from conf/ and runs the job; an installed lightbert
runs the same as `lightbert-evaluate`.
"""

from lightbert.cli.commands import evaluate_command

if __name__ == "__main__":
    evaluate_command()
