"""The BERT encoder and its heads: plain PyTorch, no Lightning or Hydra."""

from lightbert.model.bert import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertLayer,
    BertModel,
)
from lightbert.model.config import BertConfig

__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertLayer",
    "BertModel",
]
