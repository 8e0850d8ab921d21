"""A fine-tuned model, whoever saved it: which head it has, that head's network with its weights, and the settings
its run used (label names, lengths, SQuAD's windows and null threshold).

`load_finetuned(init_from)` reads a lightbert run directory or .ckpt (the head from the task module's arguments, the
settings from the run's `.hydra/config.yaml` and `predictions/eval.json`) or a Hugging Face directory (the head from
`architectures`, labels from `id2label`, lightbert's settings from the `lightbert` entry that `convert to-hf`
writes). `predict.py` and `convert to-hf` / `to-onnx` start from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf
from torch import nn

from lightbert.checkpoints.reading import HeadCarry, Pretrained, load_into, load_pretrained
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.model import BertConfig
from lightbert.tasks.heads import HEADS, Head, HeadArguments, head_named, head_of_hf_class


@dataclass
class FineTuned:
    head: str  # a name in lightbert.tasks.heads.HEADS
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
            "prediction, or a bare encoder). Fine-tune it first, python src/train.py task=<a fine-tuning task> "
            f"init_from={init_from}, and use that run"
        )
    head, arguments = found
    config = BertConfig.from_dict(pretrained.config)
    recorded_task, recorded = _recorded(pretrained, HEADS[head])
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

    A lightbert checkpoint records its head (lightbert.tasks.heads); a Hugging Face directory names its class in
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


def _recorded(pretrained: Pretrained, head: Head) -> tuple[str | None, dict]:
    """The task and settings of the run that trained it: from its .hydra/config.yaml and run directory, as its head
    reads them (`Head.recorded_settings`); from a Hugging Face directory, config.json's `lightbert` entry (which
    `convert to-hf` writes)."""
    if pretrained.hf_config:
        recorded = pretrained.hf_config.get("lightbert") or {}
        return recorded.get("task"), dict(recorded.get("settings") or {})
    run = pretrained.run_dir
    if run is None or not (run / ".hydra" / "config.yaml").is_file():
        return None, {}
    task = RecordedTask(OmegaConf.load(run / ".hydra" / "config.yaml"))
    name = task.get("name")
    return (str(name) if name is not None else None), head.recorded_settings(task, run)


class RecordedTask(Mapping):
    """A run's recorded `task.*` values: the config as it was composed, whose interpolations of Hydra's runtime no
    longer resolve; a value that does not resolve reads as absent."""

    def __init__(self, config: DictConfig):
        self.config = config

    def __getitem__(self, key: str):
        value = OmegaConf.select(self.config, f"task.{key}", default=None, throw_on_resolution_failure=False)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self):
        return iter(self.config.get("task") or {})

    def __len__(self) -> int:
        return len(self.config.get("task") or {})
