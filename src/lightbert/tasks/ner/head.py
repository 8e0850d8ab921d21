"""NER's head in the registry (lightbert.tasks.heads): token classification, fine-tuned or feature-based (paper
Table 7)."""

from __future__ import annotations

from torch import nn

from lightbert.model import BertConfig, BertForTokenClassification
from lightbert.model.feature_based import FeatureBasedTagger
from lightbert.tasks.heads import Head, HeadArguments, register
from lightbert.tasks.ner.module import TokenClassificationModule
from lightbert.tasks.ner.predictor import TokenClassification


def _arguments(hp: dict) -> HeadArguments:
    combination = hp.get("layer_combination")
    feature_based = None
    if combination:
        feature_based = {
            "combination": combination,
            "lstm_hidden_size": hp.get("lstm_hidden_size", 768),
            "lstm_layers": hp.get("lstm_layers", 2),
        }
    return HeadArguments(tuple(hp["label_names"]), feature_based=feature_based, bilstm=bool(hp.get("bilstm", False)))


def _tagger(config: BertConfig, a: HeadArguments) -> nn.Module:
    if a.feature_based is not None:
        return FeatureBasedTagger(config, len(a.labels), **a.feature_based)
    return BertForTokenClassification(config, len(a.labels), bilstm=a.bilstm)


register(
    Head(
        "token_classification",
        TokenClassificationModule,
        _tagger,
        "BertForTokenClassification",
        TokenClassification,
        arguments=_arguments,
        labelled=True,
    )
)
