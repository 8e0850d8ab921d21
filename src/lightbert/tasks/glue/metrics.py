"""GLUE's leaderboard metrics (validation) and its submission files (test predictions)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchmetrics import Accuracy, F1Score, MatthewsCorrCoef, MetricCollection, PearsonCorrCoef, SpearmanCorrCoef

from lightbert.files import open_atomically
from lightbert.tasks.finetuning.predictions import Predictions
from lightbert.tasks.glue.tasks import GlueTask


def glue_metrics(spec: GlueTask) -> MetricCollection:
    """The leaderboard's metrics of a task; classification metrics take class indices, regression ones scores."""
    factories = {
        "accuracy": lambda: Accuracy(task="multiclass", num_classes=spec.num_labels),
        "f1": lambda: F1Score(task="binary"),  # of the positive class (1: equivalent / duplicate)
        "mcc": lambda: MatthewsCorrCoef(task="binary"),
        "pearson": PearsonCorrCoef,
        "spearman": SpearmanCorrCoef,
    }
    return MetricCollection({name: factories[name]() for name in spec.metrics})


@dataclass
class GlueSubmission:
    """GLUE's `PredictionWriter`: one TSV per test split (`index<TAB>prediction`), named as the server expects
    (CoLA.tsv ... AX.tsv), with label names where it wants names (MNLI, QNLI, RTE, AX)."""

    spec: GlueTask

    def write(self, predictions: Predictions, out_dir: Path) -> list[Path]:
        files = dict(zip(self.spec.test_splits, self.spec.submission_files, strict=True))
        written = []
        for split, by_idx in predictions.items():
            path = out_dir / files[split]
            with open_atomically(path) as f:
                f.write("index\tprediction\n")
                for idx in sorted(by_idx):
                    f.write(f"{idx}\t{self.label(by_idx[idx])}\n")
            written.append(path)
        return written

    def label(self, prediction: float | int) -> str:
        if self.spec.is_regression:
            return f"{min(5.0, max(0.0, float(prediction))):.3f}"  # the server's STS-B range
        if self.spec.submit_label_names:
            return self.spec.label_names[int(prediction)]
        return str(int(prediction))
