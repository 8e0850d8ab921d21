"""SQuAD's head in the registry (lightbert.tasks.heads): answer spans, and for v2.0 the null threshold the run used."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightbert.model import BertForQuestionAnswering
from lightbert.tasks.heads import Head, register
from lightbert.tasks.squad.module import QuestionAnsweringModule
from lightbert.tasks.squad.predictor import QuestionAnswering


def _null_threshold(task: Mapping[str, Any], run_dir: Path) -> dict:
    """The threshold the run tuned on its dev set (or was given), as its predictions used it (predictions/eval.json);
    else as task.null_score_diff_threshold set it."""
    threshold = task.get("null_score_diff_threshold")
    scores = run_dir / "predictions" / "eval.json"
    if scores.is_file():
        threshold = json.loads(scores.read_text()).get("null_threshold", threshold)
    return {} if threshold is None else {"null_threshold": float(threshold)}


register(
    Head(
        "question_answering",
        QuestionAnsweringModule,
        lambda config, a: BertForQuestionAnswering(config, bilstm=a.bilstm),
        "BertForQuestionAnswering",
        QuestionAnswering,
        onnx_outputs=("start_logits", "end_logits"),
        defaults={
            "max_seq_length": 384,
            "doc_stride": 128,
            "max_query_length": 64,
            "n_best_size": 20,
            "max_answer_length": 30,
            "version": "1.1",
            "null_threshold": 0.0,  # the reference's null_score_diff_threshold default
        },
        recorded_extra=_null_threshold,
    )
)
