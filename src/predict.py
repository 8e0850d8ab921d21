"""Predictions of a fine-tuned model: `python src/predict.py init_from=... input_file=... output_file=...`
(docs/using-a-model.md).

Thin on purpose: `lightbert.cli.commands` composes the config from conf/ and runs the job; an installed lightbert
runs the same as `lightbert-predict`.
"""

from lightbert.cli.commands import predict_command

if __name__ == "__main__":
    predict_command()
