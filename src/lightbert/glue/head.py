"""GLUE's head in the registry (lightbert.heads): sequence classification and regression on the [CLS] vector."""

from __future__ import annotations

from lightbert.glue.data import glue_task
from lightbert.glue.module import SequenceClassificationModule
from lightbert.glue.predictor import SequenceClassification
from lightbert.heads import Head, HeadArguments, register
from lightbert.model import BertForSequenceClassification


def _arguments(hp: dict) -> HeadArguments:
    spec = glue_task(hp["task"])
    return HeadArguments(spec.label_names, spec.name, bilstm=bool(hp.get("bilstm", False)))


register(
    Head(
        "sequence_classification",
        SequenceClassificationModule,
        lambda config, a: BertForSequenceClassification(config, len(a.labels) or 1, bilstm=a.bilstm),
        "BertForSequenceClassification",
        SequenceClassification,
        arguments=_arguments,
        labelled=True,
        reads_cls=True,
    )
)
