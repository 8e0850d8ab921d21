"""The BERT encoder and its heads: plain PyTorch, no Lightning or Hydra."""

from lightbert.model.bert import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLayer,
    BertModel,
)
from lightbert.model.config import BertConfig
from lightbert.model.layouts import PackedRows

__all__ = [
    "BertConfig",
    "BertForMultipleChoice",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertLayer",
    "BertModel",
    "PackedRows",
]
