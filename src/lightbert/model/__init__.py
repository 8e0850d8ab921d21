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
from lightbert.model.layouts import PackedRows
from lightbert.model_config import BertConfig

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
