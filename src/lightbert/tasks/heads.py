"""The fine-tuned heads, one record each, in one registry.

A record says everything the rest of lightbert needs to know about a head: the LightningModule that trains it, how
to build its network, the Hugging Face class with the same parameter names (`convert to-hf` writes it as
`architectures`), the predictor that runs it on new records (`src/predict.py`), its ONNX outputs, and the settings a
run of it used when its own record does not say. A checkpoint records its head's name (the module's `head`,
saved by `TaskModule.on_save_checkpoint`); a Hugging Face directory its `architectures`. Nothing guesses a head from
parameter names.

Each task family registers its head in its own folder, in `<family>/head.py` (`register(Head(...))`); the registry
imports those modules on its first lookup, so a new family is its folder and its YAML, and nothing here
(docs/adding-a-task.md). A head may also be registered from anywhere else (a user's own code) before it is
looked up.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightbert.errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from lightbert.model import BertConfig
    from lightbert.tasks.task_module import TaskModule


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


def head_of_hf_class(architecture: str) -> Head | None:
    """The first registered head whose Hugging Face class is `architecture`."""
    return next((h for h in HEADS.values() if h.hf_class == architecture), None)


def recorded_defaults(task: Mapping[str, Any], defaults: dict) -> dict:
    """The values of `defaults`' keys that a run's task config (`task`) holds, each of its default's type."""
    settings = {}
    for key, default in defaults.items():
        value = task.get(key)
        if value is not None:
            settings[key] = type(default)(value) if default is not None else value
    return settings
