"""GLUE's nine tasks as a table: each task's text columns, labels, leaderboard metrics, splits and submission files.
The data (`data.py`) and the metrics and submission files (`metrics.py`) read it."""

from __future__ import annotations

from dataclasses import dataclass

from lightbert.errors import UserError


@dataclass(frozen=True)
class GlueTask:
    name: str
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...]  # () for regression
    metrics: tuple[str, ...]  # the leaderboard's; the task's score is their mean
    validation_splits: tuple[str, ...] = ("validation",)
    test_splits: tuple[str, ...] = ("test",)
    submission_files: tuple[str, ...] = ()  # one per test split
    submit_label_names: bool = False  # the server wants "entailment" rather than 0

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1  # one output: a regression score

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    def validation_tag(self, split: str) -> str:
        """Suffix of a validation set's metric names: '' for the only one, 'm'/'mm' for MNLI's two."""
        return {"validation_matched": "m", "validation_mismatched": "mm"}.get(split, "")


_NLI = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in (
        GlueTask("cola", ("sentence",), ("unacceptable", "acceptable"), ("mcc",), submission_files=("CoLA.tsv",)),
        GlueTask("sst2", ("sentence",), ("negative", "positive"), ("accuracy",), submission_files=("SST-2.tsv",)),
        GlueTask(
            "mrpc",
            ("sentence1", "sentence2"),
            ("not_equivalent", "equivalent"),
            ("f1", "accuracy"),
            submission_files=("MRPC.tsv",),
        ),
        GlueTask("stsb", ("sentence1", "sentence2"), (), ("pearson", "spearman"), submission_files=("STS-B.tsv",)),
        GlueTask(
            "qqp",
            ("question1", "question2"),
            ("not_duplicate", "duplicate"),
            ("f1", "accuracy"),
            submission_files=("QQP.tsv",),
        ),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            validation_splits=("validation_matched", "validation_mismatched"),
            # AX, the diagnostic set, has no training data: the MNLI model predicts it.
            test_splits=("test_matched", "test_mismatched", "ax"),
            submission_files=("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"),
            submit_label_names=True,
        ),
        GlueTask(
            "qnli",
            ("question", "sentence"),
            _NLI,
            ("accuracy",),
            submission_files=("QNLI.tsv",),
            submit_label_names=True,
        ),
        GlueTask(
            "rte",
            ("sentence1", "sentence2"),
            _NLI,
            ("accuracy",),
            submission_files=("RTE.tsv",),
            submit_label_names=True,
        ),
        GlueTask(
            "wnli",
            ("sentence1", "sentence2"),
            ("not_entailment", "entailment"),
            ("accuracy",),
            submission_files=("WNLI.tsv",),
        ),
    )
}


def glue_task(name: str) -> GlueTask:
    if name not in TASKS:
        raise UserError(f"unknown GLUE task {name!r}; valid: {sorted(TASKS)}")
    return TASKS[name]
