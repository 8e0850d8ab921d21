"""A fine-tuned model, whoever saved it: which head it has, that head's network with its weights, and the settings
its run used (label names, lengths, SQuAD's windows and null threshold).

`load_finetuned(init_from)` reads a lightbert run directory or .ckpt (the head from the task module's arguments, the
settings from the run's `.hydra/config.yaml` and `predictions/eval.json`) or a Hugging Face directory (the head from
`architectures`, labels from `id2label`, lightbert's settings from the `lightbert` entry that `convert to-hf`
writes). `predict.py` and `convert to-hf` / `to-onnx` start from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf
from torch import nn

from lightbert.checkpoints.reading import Pretrained, load_into, load_pretrained
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.model import BertConfig
from lightbert.tasks.heads import HEADS, Head, head_of


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


def _recorded(pretrained: Pretrained, head: Head) -> tuple[str | None, dict]:
    """The task and settings of the run that trained it: from its .hydra/config.yaml and run directory, as its head
    reads them (`Head.recorded_settings`); from a Hugging Face directory, config.json's `lightbert` entry (which
    `convert to-hf` writes)."""
    if pretrained.hf_config:
        recorded = pretrained.hf_config.get("lightbert") or {}
        settings = dict(recorded.get("settings") or {})
        if pretrained.sentence is not None and not recorded:  # where sentence-transformers cuts the texts
            positions = pretrained.config["max_position_embeddings"]
            settings["max_seq_length"] = min(pretrained.sentence["max_seq_length"] or positions, positions)
        return recorded.get("task"), settings
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
