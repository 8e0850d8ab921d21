"""A fine-tuned model, whoever saved it: which head it has, that head's network with its weights, and the settings
its run used (label names, lengths, SQuAD's windows and null threshold).

`load_finetuned(init_from)` reads a lightbert run directory or .ckpt (the head from the task module's arguments, the
settings from the run's `.hydra/config.yaml` and `predictions/eval.json`) or a Hugging Face directory (the head from
`architectures`, labels from `id2label`, lightbert's settings from the `lightbert` entry that `convert to-hf`
writes). `predict.py` and `convert to-hf` / `to-onnx` start from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from omegaconf import OmegaConf
from torch import nn

from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.heads import HEADS, Head, HeadArguments, head_named, head_of_hf_class
from lightbert.interop.hf import HeadCarry, Pretrained, load_into, load_pretrained
from lightbert.model import BertConfig

RUN_SETTING_KEYS = ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length", "version")


@dataclass
class FineTuned:
    head: str  # a name in lightbert.heads.HEADS
    model: nn.Module  # in eval mode
    tokenizer: BertTokenizer
    config: BertConfig
    labels: tuple[str, ...] = ()  # class names or tags; () for regression, question answering and multiple choice
    task: str | None = None  # the lightbert task that trained it (sst2, squad_v2, conll2003, swag), when known
    settings: dict = field(default_factory=dict)  # the head's `defaults` keys, as the run used them
    source: str = ""
    feature_based: dict | None = None  # the feature-based tagger's arguments (no Hugging Face class has it)
    bilstm: bool = False  # a BiLSTM between the encoder and the head (paper Table 5's + BiLSTM row)

    @property
    def is_regression(self) -> bool:
        return HEADS[self.head].labelled and not self.labels  # one unnamed output

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
    unrecorded = [k for k in pretrained.state_dict if not k.startswith(("bert.", "cls."))]
    if found is None and unrecorded and not pretrained.hf_config:
        raise UserError(
            f"init_from={init_from} holds head weights ({unrecorded[0]}, ...) but does not record which head they "
            "are: it was saved by a lightbert from before checkpoints recorded their head. Export it to a Hugging "
            "Face directory with that version's convert to-hf and use the directory, or fine-tune again"
        )
    if found is None:
        raise UserError(
            f"init_from={init_from} has no fine-tuned head: it is a pre-trained model (masked LM and next-sentence "
            "prediction, or a bare encoder). Fine-tune it first, e.g. python src/train.py task=glue/sst2 "
            f"init_from={init_from}, and use that run"
        )
    head, arguments = found
    config = BertConfig.from_dict(pretrained.config)
    recorded_task, recorded = _recorded(pretrained)
    settings = {**HEADS[head].defaults, **recorded}
    task = arguments.task or recorded_task
    model = HEADS[head].build(config, arguments)
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
        arguments.labels,
        task,
        settings,
        pretrained.source,
        arguments.feature_based,
        arguments.bilstm,
    )


def head_of(pretrained: Pretrained) -> tuple[str, HeadArguments] | None:
    """The head of a checkpoint and what its network was built with; None for one without a fine-tuned head.

    A lightbert checkpoint records its head (lightbert.heads); a Hugging Face directory names its class in
    `architectures`, and its labels in `id2label`."""
    if pretrained.head is not None:
        head = head_named(pretrained.head, pretrained.source)
        return head.name, head.arguments(pretrained.hyper_parameters)
    hf = pretrained.hf_config
    head = head_of_hf_class((hf.get("architectures") or [""])[0])
    if head is None:
        return None
    labels: tuple[str, ...] = ()
    if head.labelled:
        id2label = hf.get("id2label") or {}
        labels = tuple(id2label[k] for k in sorted(id2label, key=int))
        if hf.get("problem_type") == "regression":
            labels = ()
    return head.name, HeadArguments(labels)


GENERIC_LABEL = re.compile(r"LABEL_(\d+)")  # transformers' names for labels nobody named


def label_rows(found: tuple[str, ...], wanted: tuple[str, ...]) -> tuple[tuple[int, ...], str] | None:
    """The checkpoint's label rows in the task's order, and how they were matched; None where the meaning differs.

    Labels match by name, ignoring case (a classifier's NEGATIVE is the task's negative), whatever their order;
    transformers' generic names (LABEL_0, LABEL_1, ...) say nothing of meaning and are taken by index. A regression
    head (no labels) matches one unnamed output."""
    if not wanted:
        return ((0,), "one regression output") if found in ((), ("LABEL_0",)) else None
    if len(found) != len(wanted):
        return None
    if all(GENERIC_LABEL.fullmatch(name) for name in found):
        if sorted(int(GENERIC_LABEL.fullmatch(name)[1]) for name in found) != list(range(len(found))):
            return None
        rows = tuple(int(GENERIC_LABEL.fullmatch(name)[1]) for name in found)
        return tuple(rows.index(i) for i in range(len(rows))), "by index (its labels are transformers' LABEL_i)"
    folded, task = [n.casefold() for n in found], [n.casefold() for n in wanted]
    if len(set(folded)) != len(folded) or set(folded) != set(task):
        return None
    rows = tuple(folded.index(name) for name in task)
    if rows == tuple(range(len(rows))):
        return rows, "by name, in the same order"
    order = ", ".join(found[i] for i in rows)
    return rows, f"by name, its rows reordered to the task's order ({order})"


def carry_head(pretrained: Pretrained, wanted: Head, wanted_arguments: HeadArguments) -> HeadCarry:
    """Whether the checkpoint's fine-tuned head can start the task's head: only where its meaning is known to
    match (the same kind of head, built the same way, with the task's labels); otherwise the task's head starts
    fresh. The line says which, and why."""
    what = wanted.name.replace("_", " ")
    found = head_of(pretrained)
    if found is None:
        return HeadCarry(False, line=f"the {what} head starts fresh ({pretrained.source} has no fine-tuned head)")
    name, arguments = found
    if name != wanted.name:
        has = name.replace("_", " ")
        return HeadCarry(False, line=f"the {what} head starts fresh ({pretrained.source} has a {has} head)")
    built = (arguments.bilstm, arguments.feature_based is not None)
    if built != (wanted_arguments.bilstm, wanted_arguments.feature_based is not None):
        return HeadCarry(False, line=f"the {what} head starts fresh ({pretrained.source}'s head is built another way)")
    if not wanted.labelled:
        return HeadCarry(True, line=f"the {what} head is carried from {pretrained.source}")
    matched = label_rows(arguments.labels, wanted_arguments.labels)
    if matched is None:
        return HeadCarry(
            False,
            line=f"the {what} head starts fresh: {pretrained.source}'s labels {list(arguments.labels)} are not "
            f"the task's {list(wanted_arguments.labels)}",
        )
    rows, how = matched
    keep = None if rows == tuple(range(len(rows))) else rows
    return HeadCarry(True, keep, line=f"the {what} head is carried from {pretrained.source}, its labels matched {how}")


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
    head = HEADS[finetuned.head]
    config: dict = {"architectures": [head.hf_class]}
    if finetuned.config.causal:
        if head.reads_cls:
            raise UserError(
                f"{finetuned.source} is a left-to-right model (task.objective=ltr): its classifier reads each "
                "sequence's last token, and Hugging Face's reads [CLS]; run it with src/predict.py or export it with "
                "to-onnx"
            )
        config["is_decoder"] = True  # transformers' BertModel then attends left to right, as this model does
    if head.labelled:
        names = finetuned.labels or ("LABEL_0",)
        config["id2label"] = dict(enumerate(names))
        config["label2id"] = {name: i for i, name in enumerate(names)}
        # transformers reads a single unnamed output as a regression only when told so
        config["problem_type"] = "regression" if finetuned.is_regression else "single_label_classification"
    config["lightbert"] = {"task": finetuned.task, "settings": finetuned.settings}
    return config


def pretraining_head_config(pretrained: Pretrained) -> dict:
    """config.json's architecture for a pre-trained model of each objective (lightbert.pretraining.objectives):
    MLM + NSP is `BertForPreTraining`, MLM alone `BertForMaskedLM`, the left-to-right LM `BertLMHeadModel` as a
    decoder (its causal self-attention is this model's)."""
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
