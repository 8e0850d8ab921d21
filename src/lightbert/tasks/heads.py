"""The fine-tuned heads, one record each, in one registry.

A record says everything the rest of lightbert needs to know about a head: the LightningModule that trains it, how
to build its network, the Hugging Face class with the same parameter names (`convert to-hf` writes it as
`architectures`), the predictor that runs it on new records (`src/predict.py`), its ONNX outputs, and the settings a
run of it used when its own record does not say. A checkpoint records its head's name (the module's `head`,
saved by `TaskModule.on_save_checkpoint`); a Hugging Face directory its `architectures`. Nothing guesses a head from
parameter names: `head_of` reads a checkpoint's head from those records, and `carry_head` decides whether it can
start a task's head (the same kind, built the same way, with the task's labels in any order).

Each task family registers its head in its own folder, in `<family>/head.py` (`register(Head(...))`); the registry
imports those modules on its first lookup, so a new family is its folder and its YAML, and nothing here
(docs/adding-a-task.md). A head may also be registered from anywhere else (a user's own code) before it is
looked up.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightbert.checkpoints.reading import HeadCarry, Pretrained
from lightbert.errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from lightbert.model import BertConfig
    from lightbert.tasks.task_module import TaskModule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadArguments:
    """What a fine-tuned model of a head was built with, beyond the encoder's config."""

    labels: tuple[str, ...] = ()  # class names or tags; () for regression, question answering, multiple choice
    task: str | None = None  # the lightbert task that trained it, when its arguments say (a GLUE task)
    feature_based: dict | None = None  # the feature-based tagger's arguments
    bilstm: bool = False  # a BiLSTM between the encoder and the head (paper Table 5's + BiLSTM row)
    pooling: str | None = None  # a sentence embedding model's pooling (lightbert.model.embedding.POOLINGS)
    normalize: bool = False  # a sentence embedding model's vectors are L2-normalised


@dataclass(frozen=True)
class Head:
    name: str
    module: type[TaskModule]  # the LightningModule that trains it; its `head` is this name
    build: Callable[[BertConfig, HeadArguments], nn.Module]  # the network, fresh
    hf_class: str  # the Hugging Face class with the same parameter names
    predictor: type  # its Predictor subclass (lightbert.tasks.finetuning.predictor), which runs it on new records
    onnx_outputs: tuple[str, ...] = ("logits",)
    # The settings a run of it uses beyond the encoder (the task files' values): a fine-tuned model's run records
    # its own (`recorded_settings`), these stand in where it does not (a Hugging Face directory from elsewhere).
    defaults: dict = field(default_factory=lambda: {"max_seq_length": 128})
    # The module's saved arguments -> what the network was built with (labels, task, ...).
    arguments: Callable[[dict], HeadArguments] = lambda hp: HeadArguments(bilstm=bool(hp.get("bilstm", False)))
    labelled: bool = False  # has named labels (a Hugging Face config's id2label)
    reads_cls: bool = False  # reads the [CLS] vector (a left-to-right model reads its last token instead)
    choices: int = 0  # the choices in an example batch (ONNX export); 0 for a plain (B, T) batch
    # What a run recorded beyond its task.* values of `defaults`' keys (its task config, its run directory), e.g. a
    # threshold it tuned on its dev set.
    recorded_extra: Callable[[Mapping[str, Any], Path], dict] = lambda task, run_dir: {}
    # A sentence embedding head: its Hugging Face class is the bare encoder, which a pre-trained encoder shares, so a
    # Hugging Face directory is of this head only where sentence-transformers' files say so (`Pretrained.sentence`).
    sentence_embedding: bool = False
    # The module's arguments that a run leaves null for init_from to decide: init_from's own where it is a model of
    # this head (its `HeadArguments`), else the head's defaults (called with None). The embedding head's pooling.
    from_checkpoint: Callable[[HeadArguments | None], dict] | None = None

    def network(self, config: BertConfig, hyper_parameters: dict) -> nn.Module:
        """The network, fresh, from its module's arguments: the one builder of each head's network, for the module
        that trains it and for a fine-tuned model read back (`lightbert.tasks.finetuned`) alike."""
        return self.build(config, self.arguments(hyper_parameters))

    def recorded_settings(self, task: Mapping[str, Any], run_dir: Path) -> dict:
        """The settings a run of this head used, from its task config (`task`) and its run directory."""
        return {**recorded_defaults(task, self.defaults), **self.recorded_extra(task, run_dir)}


class HeadRegistry(dict):
    """name -> Head; every family's head is registered (its `<family>/head.py` imported) before the first lookup."""

    _found = False

    def _find_families(self) -> None:
        if HeadRegistry._found:
            return
        HeadRegistry._found = True
        import lightbert.tasks

        for package in pkgutil.iter_modules(lightbert.tasks.__path__):
            if package.ispkg and importlib.util.find_spec(f"lightbert.tasks.{package.name}.head") is not None:
                importlib.import_module(f"lightbert.tasks.{package.name}.head")

    def __getitem__(self, name: str) -> Head:
        self._find_families()
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        self._find_families()
        return super().__contains__(name)

    def __iter__(self) -> Iterator[str]:
        self._find_families()
        return super().__iter__()

    def __len__(self) -> int:
        self._find_families()
        return super().__len__()

    def get(self, name: str, default: Any = None) -> Any:
        self._find_families()
        return super().get(name, default)

    def keys(self):
        self._find_families()
        return super().keys()

    def values(self):
        self._find_families()
        return super().values()

    def items(self):
        self._find_families()
        return super().items()


HEADS: HeadRegistry = HeadRegistry()


def register(head: Head) -> Head:
    """Adds a head; its module must name it (`head = "<name>"`), so that its checkpoints record it."""
    if head.module.head != head.name:
        raise TypeError(f"{head.module.__name__}.head is {head.module.head!r}, and its record is named {head.name!r}")
    if dict.__contains__(HEADS, head.name) and dict.__getitem__(HEADS, head.name) != head:
        raise ValueError(f"a head named {head.name!r} is registered already")
    dict.__setitem__(HEADS, head.name, head)
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


def head_start(
    module: type, arguments: Mapping[str, Any], pretrained: Pretrained | None, init_from: str | None
) -> tuple[HeadCarry | None, dict]:
    """How the task's head starts from init_from, decided once before the module is built: whether its fine-tuned
    head is carried (`carry_head`; None without a head to carry: pre-training, no init_from), and the module's
    arguments the config leaves null for init_from to decide (`Head.from_checkpoint`: an embedding model's pooling),
    said on the console once."""
    wanted = task_head(module, arguments)
    if wanted is None:
        return None, {}
    head = wanted[0]
    carry = carry_head(pretrained, *wanted) if pretrained is not None else None
    if head.from_checkpoint is None:
        return carry, {}
    found = head_of(pretrained) if pretrained is not None else None
    theirs = found[1] if found is not None and found[0] == head.name else None
    chosen = {k: v for k, v in head.from_checkpoint(theirs).items() if arguments.get(k) is None}
    if chosen:
        values = ", ".join(f"task.{k}={v}" for k, v in chosen.items())
        whose = f"init_from={init_from}'s" if theirs is not None else "the defaults, init_from has none"
        log.info(f"{values}: {whose} (set them on the command line to change)")
    return carry, chosen


def task_head(module: type, arguments: Mapping[str, Any]) -> tuple[Head, HeadArguments] | None:
    """The fine-tuned head a task's LightningModule class trains, and what it is built with (its labels, from the
    module's `arguments`); None for pre-training."""
    head = head_of_module(module)
    if head is None:
        return None
    return head, head.arguments(arguments)


def head_of_hf_class(architecture: str) -> Head | None:
    """The first registered head whose Hugging Face class is `architecture` (or its ModernBERT twin: the modern
    encoder's `ModernBertForSequenceClassification` is BERT's `BertForSequenceClassification` head)."""
    bert = architecture.removeprefix("Modern")
    if not bert:  # no class named (a lightbert checkpoint of pre-training): no family's head needs importing
        return None
    return next((h for h in HEADS.values() if h.hf_class == bert and not h.sentence_embedding), None)


def recorded_defaults(task: Mapping[str, Any], defaults: dict) -> dict:
    """The values of `defaults`' keys that a run's task config (`task`) holds, each of its default's type."""
    settings = {}
    for key, default in defaults.items():
        value = task.get(key)
        if value is not None:
            settings[key] = type(default)(value) if default is not None else value
    return settings


def head_of(pretrained: Pretrained) -> tuple[str, HeadArguments] | None:
    """The head of a checkpoint and what its network was built with; None for one without a fine-tuned head.

    A lightbert checkpoint records its head's name (its module's `head`); a Hugging Face directory names its class in
    `architectures`, and its labels in `id2label`."""
    if pretrained.head is not None:
        head = head_named(pretrained.head, pretrained.source)
        return head.name, head.arguments(pretrained.hyper_parameters)
    if pretrained.sentence is not None:  # sentence-transformers' files: an embedding model, pooled as they say
        head = next(h for h in HEADS.values() if h.sentence_embedding)
        sentence = pretrained.sentence
        return head.name, HeadArguments(pooling=sentence["pooling"], normalize=sentence["normalize"])
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
