"""The command line: the entry points (`python src/train.py`, `lightbert-train`, ...), the checks on the command line
before Hydra composes it, and shell completion. Each command hands its config to one library verb (`run.train`,
`run.evaluate`, `inference`)."""
