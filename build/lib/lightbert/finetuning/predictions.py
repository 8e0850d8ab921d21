"""Evaluation, in one place: the GLUE metrics and submission files, the official SQuAD scorer and the
post-processing from logits to answers, entity-level F1 for NER.

The task modules score validation with these; after training, a task's `PredictionWriter` (which the task's
DataModule declares) turns the predictions of its prediction splits into the files a run leaves in
`predictions/`: GLUE submission TSVs, SQuAD's official JSON files, conlleval's format, each with `eval.json` where
the split has gold labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

Predictions = dict[str, dict[int, np.ndarray]]  # split -> example idx -> that example's prediction


class PredictionWriter(Protocol):
    def write(self, predictions: Predictions, out_dir: Path) -> list[Path]:
        """Writes the files of `predictions` (every prediction split) under `out_dir`; returns them."""
        ...
