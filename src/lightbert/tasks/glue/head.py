"""GLUE's head in the registry (lightbert.tasks.heads): sequence classification and regression on the [CLS] vector."""

from __future__ import annotations

from lightbert.model import BertForSequenceClassification
from lightbert.tasks.glue.module import SequenceClassificationModule
from lightbert.tasks.glue.predictor import SequenceClassification
from lightbert.tasks.glue.tasks import glue_task
from lightbert.tasks.heads import Head, HeadArguments, register


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
