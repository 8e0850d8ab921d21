"""A fine-tuned model, whoever saved it: which head it has, that head's network with its weights, and the settings
its run used (label names, lengths, SQuAD's windows and null threshold).

`load_finetuned(init_from)` reads a lightbert run directory or .ckpt (the head from the task module's arguments, the
settings from the run's `.hydra/config.yaml` and `predictions/eval.json`) or a Hugging Face directory (the head from
`architectures`, labels from `id2label`, lightbert's settings from the `lightbert` entry that `convert to-hf`
writes). `predict.py` and `convert to-hf` / `to-onnx` start from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from omegaconf import OmegaConf
from torch import nn

from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.interop import Pretrained, load_into, load_pretrained
from lightbert.model import (
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from lightbert.model.feature_based import FeatureBasedTagger

# Each head and the Hugging Face class with the same parameter names (`convert to-hf` writes it as `architectures`).
HF_CLASSES = {
    "sequence_classification": "BertForSequenceClassification",
    "question_answering": "BertForQuestionAnswering",
    "token_classification": "BertForTokenClassification",
    "multiple_choice": "BertForMultipleChoice",
}
# What a run of each head used when its own record does not say (the task files' defaults).
DEFAULT_SETTINGS = {
    "sequence_classification": {"max_seq_length": 128},
    "token_classification": {"max_seq_length": 128},
    "multiple_choice": {"max_seq_length": 128},
    "question_answering": {
        "max_seq_length": 384,
        "doc_stride": 128,
        "max_query_length": 64,
        "n_best_size": 20,
        "max_answer_length": 30,
        "version": "1.1",
        "null_threshold": 0.0,  # the reference's null_score_diff_threshold default
    },
}
RUN_SETTING_KEYS = ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length", "version")


@dataclass
class FineTuned:
    head: str  # a key of HF_CLASSES
    model: nn.Module  # in eval mode
    tokenizer: BertTokenizer
    config: BertConfig
    labels: tuple[str, ...] = ()  # class names or tags; () for regression, question answering and multiple choice
    task: str | None = None  # the lightbert task that trained it (sst2, squad_v2, conll2003, swag), when known
    settings: dict = field(default_factory=dict)  # DEFAULT_SETTINGS' keys, as the run used them
    source: str = ""
    feature_based: dict | None = None  # the feature-based tagger's arguments (no Hugging Face class has it)
    bilstm: bool = False  # a BiLSTM between the encoder and the head (paper Table 5's + BiLSTM row)

    @property
    def is_regression(self) -> bool:
        return self.head == "sequence_classification" and not self.labels

    def describe(self) -> str:
        what = self.head.replace("_", " ")
        task = f" ({self.task})" if self.task else ""
        return f"a {what} model{task}"


def load_finetuned(init_from: str) -> FineTuned:
    return finetuned_from(load_pretrained(str(init_from)), init_from)


def finetuned_from(pretrained: Pretrained, init_from: str) -> FineTuned:
    if pretrained.tokenizer is None:
        raise UserError(f"init_from={init_from} comes without a tokenizer (tokenizer.json or vocab.txt beside it)")
    found = head_of(pretrained)
    if found is None:
        raise UserError(
            f"init_from={init_from} has no fine-tuned head: it is a pre-trained model (masked LM and next-sentence "
            "prediction, or a bare encoder). Fine-tune it first, e.g. python src/train.py task=glue/sst2 "
            f"init_from={init_from}, and use that run"
        )
    head, labels, task, feature_based = found
    config = BertConfig.from_dict(pretrained.config)
    recorded_task, recorded = _recorded(pretrained)
    settings = {**DEFAULT_SETTINGS[head], **recorded}
    task = task or recorded_task
    bilstm = bool(pretrained.hyper_parameters.get("bilstm", False))
    model = _build(head, config, len(labels) or 1, feature_based, bilstm)
    fresh = load_into(model, pretrained)
    if fresh:
        raise UserError(
            f"init_from={init_from} lacks weights of its {head.replace('_', ' ')} head ({', '.join(fresh[:3])}); "
            "it is not a complete fine-tuned checkpoint"
        )
    return FineTuned(
        head,
        model.eval(),
        pretrained.tokenizer,
        config,
        labels,
        task,
        settings,
        pretrained.source,
        feature_based,
        bilstm,
    )


def head_of(pretrained: Pretrained) -> tuple[str, tuple[str, ...], str | None, dict | None] | None:
    """(head, labels, task, feature-based arguments) of a checkpoint; None for one without a fine-tuned head."""
    hp, hf = pretrained.hyper_parameters, pretrained.hf_config
    if "task" in hp:  # SequenceClassificationModule(task=...): a GLUE task
        from lightbert.data.glue import glue_task

        spec = glue_task(hp["task"])
        return "sequence_classification", spec.label_names, spec.name, None
    if "label_names" in hp:  # TokenClassificationModule
        combination = hp.get("layer_combination")
        feature_based = None
        if combination:
            feature_based = {
                "combination": combination,
                "lstm_hidden_size": hp.get("lstm_hidden_size", 768),
                "lstm_layers": hp.get("lstm_layers", 2),
            }
        return "token_classification", tuple(hp["label_names"]), None, feature_based
    if "num_choices" in hp:
        return "multiple_choice", (), None, None
    if "qa_outputs.weight" in pretrained.state_dict:
        return "question_answering", (), None, None
    architecture = (hf.get("architectures") or [""])[0]
    heads = {cls: head for head, cls in HF_CLASSES.items()}
    if architecture not in heads:
        return None
    head = heads[architecture]
    labels: tuple[str, ...] = ()
    if head in ("sequence_classification", "token_classification"):
        id2label = hf.get("id2label") or {}
        labels = tuple(id2label[k] for k in sorted(id2label, key=int))
        if head == "sequence_classification" and hf.get("problem_type") == "regression":
            labels = ()
    return head, labels, None, None


def hf_head_config(finetuned: FineTuned) -> dict:
    """config.json's entries that make a Hugging Face directory of this head: what `AutoModelFor...` and
    `pipeline` read (architectures, labels), and lightbert's own (the task and the run's settings) for predict.py."""
    if finetuned.feature_based is not None:
        raise UserError(
            f"{finetuned.source} is a feature-based tagger (a frozen BERT feeding a BiLSTM), which no Hugging Face "
            "class holds; run it with src/predict.py, or export it with to-onnx"
        )
    if finetuned.bilstm:
        raise UserError(
            f"{finetuned.source} has a BiLSTM between its encoder and its head, which no Hugging Face class holds; "
            "run it with src/predict.py"
        )
    config: dict = {"architectures": [HF_CLASSES[finetuned.head]]}
    if finetuned.config.causal:
        if finetuned.head in ("sequence_classification", "multiple_choice"):
            raise UserError(
                f"{finetuned.source} is a left-to-right model (task.objective=ltr): its classifier reads each "
                "sequence's last token, and Hugging Face's reads [CLS]; run it with src/predict.py or export it with "
                "to-onnx"
            )
        config["is_decoder"] = True  # transformers' BertModel then attends left to right, as this model does
    if finetuned.head in ("sequence_classification", "token_classification"):
        names = finetuned.labels or ("LABEL_0",)
        config["id2label"] = dict(enumerate(names))
        config["label2id"] = {name: i for i, name in enumerate(names)}
    if finetuned.head == "sequence_classification":
        config["problem_type"] = "regression" if finetuned.is_regression else "single_label_classification"
    config["lightbert"] = {"task": finetuned.task, "settings": finetuned.settings}
    return config


def pretraining_head_config(pretrained: Pretrained) -> dict:
    """config.json's architecture for a pre-trained model of each objective (lightbert.objectives): MLM + NSP is
    `BertForPreTraining`, MLM alone `BertForMaskedLM`, the left-to-right LM `BertLMHeadModel` as a decoder (its
    causal self-attention is this model's)."""
    if BertConfig.from_dict(pretrained.config).causal:
        return {"architectures": ["BertLMHeadModel"], "is_decoder": True}
    if "cls.seq_relationship.weight" not in pretrained.state_dict:
        return {"architectures": ["BertForMaskedLM"]}
    return {}


def _recorded(pretrained: Pretrained) -> tuple[str | None, dict]:
    """The task and settings of the run that trained it: from its .hydra/config.yaml and, for SQuAD v2.0, the null
    threshold its dev predictions used (predictions/eval.json); from a Hugging Face directory, config.json's
    `lightbert` entry (which `convert to-hf` writes)."""
    if pretrained.hf_config:
        recorded = pretrained.hf_config.get("lightbert") or {}
        return recorded.get("task"), dict(recorded.get("settings") or {})
    run = pretrained.run_dir
    if run is None or not (run / ".hydra" / "config.yaml").is_file():
        return None, {}
    recorded = OmegaConf.load(run / ".hydra" / "config.yaml")
    settings = {}
    for key in RUN_SETTING_KEYS:
        value = OmegaConf.select(recorded, f"task.{key}", default=None, throw_on_resolution_failure=False)
        if value is not None:
            settings[key] = str(value) if key == "version" else int(value)
    threshold = OmegaConf.select(
        recorded, "task.null_score_diff_threshold", default=None, throw_on_resolution_failure=False
    )
    scores = run / "predictions" / "eval.json"
    if scores.is_file():  # the threshold the run tuned on its dev set (or was given), as its predictions used
        threshold = json.loads(scores.read_text()).get("null_threshold", threshold)
    if threshold is not None:
        settings["null_threshold"] = float(threshold)
    task = OmegaConf.select(recorded, "task.name", default=None, throw_on_resolution_failure=False)
    return (str(task) if task is not None else None), settings


def _build(head: str, config: BertConfig, num_labels: int, feature_based: dict | None, bilstm: bool) -> nn.Module:
    if head == "sequence_classification":
        return BertForSequenceClassification(config, num_labels, bilstm=bilstm)
    if head == "question_answering":
        return BertForQuestionAnswering(config, bilstm=bilstm)
    if head == "multiple_choice":
        return BertForMultipleChoice(config)
    if feature_based is not None:
        return FeatureBasedTagger(config, num_labels, **feature_based)
    return BertForTokenClassification(config, num_labels)
