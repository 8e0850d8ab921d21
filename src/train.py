"""Train with lightbert: `python src/train.py [group=option ...] [key=value ...]` (see docs/).

Thin on purpose: `lightbert.cli.commands` composes the config from conf/ and runs the job; an installed lightbert
runs the same as `lightbert-train`.
"""

from lightbert.cli.commands import train_command

if __name__ == "__main__":
    train_command()
