"""The fine-tuned heads, one record each, in one registry.

A record says everything the rest of lightbert needs to know about a head: the LightningModule that trains it, how
to build its network, the Hugging Face class with the same parameter names (`convert to-hf` writes it as
`architectures`), the predictor that runs it on new records (`src/predict.py`), its ONNX outputs, and the settings a
run of it used when its own record does not say. A checkpoint records its head's name (the module's `head`,
saved by `TaskModule.on_save_checkpoint`); a Hugging Face directory its `architectures`. Nothing guesses a head from
parameter names.

A new head is one `register(Head(...))` call, in the family's own code or here; see docs/adding-a-task.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from lightbert.errors import UserError
from lightbert.finetuning.module import TaskModule
from lightbert.finetuning.predictor import Predictor
from lightbert.glue.data import glue_task
from lightbert.glue.module import SequenceClassificationModule
from lightbert.glue.predictor import SequenceClassification
from lightbert.model import (
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from lightbert.model.feature_based import FeatureBasedTagger
from lightbert.ner.module import TokenClassificationModule
from lightbert.ner.predictor import TokenClassification
from lightbert.squad.module import QuestionAnsweringModule
from lightbert.squad.predictor import QuestionAnswering
from lightbert.swag.module import MultipleChoiceModule
from lightbert.swag.predictor import MultipleChoice


@dataclass(frozen=True)
class HeadArguments:
    """What a fine-tuned model of a head was built with, beyond the encoder's config."""

    labels: tuple[str, ...] = ()  # class names or tags; () for regression, question answering, multiple choice
    task: str | None = None  # the lightbert task that trained it, when its arguments say (a GLUE task)
    feature_based: dict | None = None  # the feature-based tagger's arguments
    bilstm: bool = False  # a BiLSTM between the encoder and the head (paper Table 5's + BiLSTM row)


@dataclass(frozen=True)
class Head:
    name: str
    module: type[TaskModule]  # the LightningModule that trains it; its `head` is this name
    build: Callable[[BertConfig, HeadArguments], nn.Module]  # the network, fresh
    hf_class: str  # the Hugging Face class with the same parameter names
    predictor: type[Predictor]
    onnx_outputs: tuple[str, ...] = ("logits",)
    defaults: dict = field(default_factory=lambda: {"max_seq_length": 128})  # the task files' defaults
    # The module's saved arguments -> what the network was built with (labels, task, ...).
    arguments: Callable[[dict], HeadArguments] = lambda hp: HeadArguments(bilstm=bool(hp.get("bilstm", False)))
    labelled: bool = False  # has named labels (a Hugging Face config's id2label)
    reads_cls: bool = False  # reads the [CLS] vector (a left-to-right model reads its last token instead)
    choices: int = 0  # the choices in an example batch (ONNX export); 0 for a plain (B, T) batch


HEADS: dict[str, Head] = {}


def register(head: Head) -> Head:
    """Adds a head; its module must name it (`head = "<name>"`), so that its checkpoints record it."""
    if head.module.head != head.name:
        raise TypeError(f"{head.module.__name__}.head is {head.module.head!r}, and its record is named {head.name!r}")
    if head.name in HEADS and HEADS[head.name] != head:
        raise ValueError(f"a head named {head.name!r} is registered already")
    HEADS[head.name] = head
    return head


def head_named(name: str, source: str) -> Head:
    if name not in HEADS:
        raise UserError(
            f"{source} has a {name!r} head, which this lightbert does not know (it knows {', '.join(HEADS)}); "
            "use the lightbert version that trained it"
        )
    return HEADS[name]


def head_of_module(module: type) -> Head | None:
    """The head a LightningModule class trains; None for pre-training."""
    name = getattr(module, "head", None)
    return HEADS.get(name) if name else None


def head_of_hf_class(architecture: str) -> Head | None:
    """The first registered head whose Hugging Face class is `architecture`."""
    return next((h for h in HEADS.values() if h.hf_class == architecture), None)


def _glue_arguments(hp: dict) -> HeadArguments:
    spec = glue_task(hp["task"])
    return HeadArguments(spec.label_names, spec.name, bilstm=bool(hp.get("bilstm", False)))


def _ner_arguments(hp: dict) -> HeadArguments:
    combination = hp.get("layer_combination")
    feature_based = None
    if combination:
        feature_based = {
            "combination": combination,
            "lstm_hidden_size": hp.get("lstm_hidden_size", 768),
            "lstm_layers": hp.get("lstm_layers", 2),
        }
    return HeadArguments(tuple(hp["label_names"]), feature_based=feature_based)


def _tagger(config: BertConfig, a: HeadArguments) -> nn.Module:
    if a.feature_based is not None:
        return FeatureBasedTagger(config, len(a.labels), **a.feature_based)
    return BertForTokenClassification(config, len(a.labels))


register(
    Head(
        "sequence_classification",
        SequenceClassificationModule,
        lambda config, a: BertForSequenceClassification(config, len(a.labels) or 1, bilstm=a.bilstm),
        "BertForSequenceClassification",
        SequenceClassification,
        arguments=_glue_arguments,
        labelled=True,
        reads_cls=True,
    )
)
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
    )
)
register(
    Head(
        "token_classification",
        TokenClassificationModule,
        _tagger,
        "BertForTokenClassification",
        TokenClassification,
        arguments=_ner_arguments,
        labelled=True,
    )
)
register(
    Head(
        "multiple_choice",
        MultipleChoiceModule,
        lambda config, a: BertForMultipleChoice(config),
        "BertForMultipleChoice",
        MultipleChoice,
        arguments=lambda hp: HeadArguments(),
        reads_cls=True,
        choices=2,
    )
)
