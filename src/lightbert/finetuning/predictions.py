"""What a fine-tuning family's prediction files are written from: `Predictions` (split -> example -> prediction) and the
`PredictionWriter` protocol.

After training, the best checkpoint predicts the task's prediction splits, and its `PredictionWriter` (which the
task's DataModule declares) turns those predictions into the files a run leaves in `predictions/`. The writers and
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


def write_test_predictions(trainer, module, datamodule, output_dir: Path) -> list[str]:
    """Predict the task's prediction splits with the best checkpoint and write their files, as the DataModule
    declares (`predict_splits`, `prediction_writer`; pre-training and SWAG declare none). Returns the files.

    Each prediction is one example's row of the batch's "prediction" (a class, a score, or a QA window's logits),
    as a numpy array so that gathering from other devices pickles just that row.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightbert.distributed import gather_dict
    from lightbert.finetuning.datamodule import FineTuningDataModule

    if not isinstance(datamodule, FineTuningDataModule):
        return []  # pre-training predicts nothing after training
    splits = datamodule.predict_splits
    if not splits or datamodule.prediction_writer() is None:
        return []
    checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.monitor), None)
    ckpt_path = checkpoint.best_model_path if checkpoint is not None and checkpoint.best_model_path else None
    batches = trainer.predict(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    if len(splits) == 1:
        batches = [batches]
    predictions = {}
    for split, split_batches in zip(splits, batches, strict=True):
        by_idx = {}
        for out in split_batches:
            prediction = out["prediction"].detach().cpu()
            if prediction.is_floating_point():
                prediction = prediction.float()  # numpy has no bfloat16
            by_idx.update(zip(out["idx"].tolist(), prediction.numpy(), strict=True))
        predictions[split] = gather_dict(by_idx)  # each rank predicted its share of every split
    if trainer.global_rank != 0:
        return []
    written = datamodule.prediction_writer().write(predictions, output_dir / "predictions")
    return [str(p) for p in written]
