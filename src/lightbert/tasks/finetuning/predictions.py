"""What a fine-tuning family's prediction files are written from: `Predictions` (split -> example -> prediction) and the
`PredictionWriter` protocol.

After training, the best checkpoint predicts the task's prediction splits (`lightbert.run.train`), and its
`PredictionWriter` (which the task's DataModule declares) turns those predictions into the files a run leaves in
`predictions/`. The writers and
the metrics live in each family's folder: GLUE's submission TSVs in `glue/metrics.py`, SQuAD's official JSON files in
`squad/answers.py`, conlleval's format in `ner/metrics.py`, each with `eval.json` where the split has gold labels.
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
