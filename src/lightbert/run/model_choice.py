"""The model a run trains, decided before any data work: its sizes (init_from's checkpoint decides them), its name,
its tokenizer (fitting init_from's embeddings), and for an evaluation whether init_from's head is the task's. The
module that holds it, with init_from's weights, is built by `run.building`."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from omegaconf import OmegaConf

from lightbert.checkpoints.reading import HeadCarry, Pretrained
from lightbert.data.tokenizer import load_tokenizer
from lightbert.errors import ConfigError, UserError
from lightbert.model_config import (
    ARCHITECTURE_FIELDS,
    INITIALIZER_FIELDS,
    REGULARISATION_FIELDS,
    SIZE_FIELDS,
    BertConfig,
)
from lightbert.run.configs import CONF_DIR
from lightbert.run.run_dir import Start
from lightbert.run.settings import RunSettings
from lightbert.tasks.heads import carry_head, head_of, head_start, task_head
from lightbert.tasks.pretraining.continued import check_added_words_fit
from lightbert.tasks.pretraining.domain_words import read_word_file

log = logging.getLogger(__name__)


class RunModel(NamedTuple):
    """The model a run trains, decided before any data work."""

    pretrained: Pretrained | None  # init_from, with the tokenizer words are added to (`vocabulary`)
    config: BertConfig  # the architecture; its vocabulary is the tokenizer's (`run.building.with_vocabulary`)
    tokenizer: dict  # what the DataModule is given of the tokenizer (`vocabulary`)
    name: str | None  # init_from's conf/model/ size (`size_name`), for the record; None: the model= the config names
    left_to_right: str | None  # why the model attends left to right, for the run line; None: both ways
    # Whether init_from's fine-tuned head starts the task's (`tasks.heads.carry_head`, which says why in its line);
    # None without a head to carry (pre-training, no init_from).
    carry: HeadCarry | None
    chosen: dict  # the task module's arguments the config leaves to init_from (`tasks.heads.head_start`)


def run_model(settings: RunSettings, start: Start, pretrained: Pretrained | None) -> RunModel:
    """The architecture, its name and its tokenizer, checked once: a bad size, an init_from without a tokenizer or
    with one that does not fit its embeddings, sequences longer than the position embeddings, too few segment
    embeddings fail here, before anything is written."""
    if pretrained is not None and pretrained.tokenizer is None and not settings.task.tokenizer_path:
        raise UserError(
            f"init_from={settings.init_from} comes without its tokenizer (tokenizer.json or vocab.txt beside the "
            "weights); copy the tokenizer it was trained with there, or give it with task.datamodule.tokenizer_path=..."
        )
    config = model_sizes(settings, pretrained)
    if config.sliding and config.local_attention % 2:
        window = config.local_attention
        log.info(
            f"model.local_attention={window} is odd: each token sees {window // 2} tokens on each side, a window of "
            f"{window - 1} (as in transformers' ModernBERT)"
        )
    name = size_name(config) if pretrained is not None else None
    left_to_right = left_to_right_because(settings, pretrained)
    pretrained, tokenizer = vocabulary(settings, start, pretrained)
    given = tokenizer.get("tokenizer")
    if settings.task.whole_word_masking and given is not None and not given.subword_ids:
        # WordPiece marks a word's continuation (`##`), which whole-word masking masks with its word; a byte-level BPE
        # (ModernBERT's) marks a word's start instead, and the masking would fail on the first batch.
        whose = f"init_from={settings.init_from}'s tokenizer" if pretrained is not None else "the tokenizer"
        raise ConfigError(
            f"task.datamodule.whole_word_masking=true masks each word with its `##` continuation pieces (WordPiece), "
            f"and {whose} has none (a byte-level BPE): set task.datamodule.whole_word_masking=false"
        )
    lengths = {"task.max_seq_length": settings.task.max_seq_length}
    for number, phase in enumerate(settings.phases):
        if phase.max_seq_length is not None:
            lengths[f"task.phases[{number}].datamodule.max_seq_length"] = phase.max_seq_length
    for key, max_seq_length in lengths.items():
        if max_seq_length and max_seq_length > config.max_position_embeddings:
            raise ConfigError(
                f"{key} ({max_seq_length}) exceeds model.max_position_embeddings "
                f"({config.max_position_embeddings}); shorten the sequences or raise max_position_embeddings"
            )
    # A model with fewer segment embeddings than the task's inputs use would fail at its first batch (an index out
    # of range in the token-type embedding): said before anything is written instead.
    if settings.task.objective == "mlm_nsp" and config.pooler != "tanh":
        has = f"init_from={settings.init_from} is" if pretrained is not None else "model.pooler=head makes"
        raise ConfigError(
            f"{has} the modern encoder, whose recipe has no next sentence prediction (its pooler is a classifier "
            "head, not NSP's); pre-train it with task=pretrain_modern or task.objective=mlm"
        )
    if settings.task.pooling == "cls" and config.causal:
        raise ConfigError(
            "task.pooling=cls reads the [CLS] token, which sees only itself in a model that attends left to right "
            f"({left_to_right}); use task.pooling=last (its last token sees the whole text) or mean"
        )
    # No segment embeddings at all (type_vocab_size 0, ModernBERT): a pair's parts are told apart by [SEP] alone.
    segments, type_vocab_size = settings.task.token_types, config.type_vocab_size
    if 0 < type_vocab_size < segments:
        has = f"init_from={settings.init_from} has" if pretrained is not None else "model.type_vocab_size is"
        raise ConfigError(
            f"{has} type_vocab_size {type_vocab_size}, and task={settings.task.option or '...'} feeds {segments} "
            f"segments (a sentence pair); fine-tune it on a task of single sentences, or start from a model with "
            f"type_vocab_size {segments}"
        )
    task = settings.task
    carry, chosen = head_start(task.module_class, task.module_arguments, pretrained, settings.init_from)
    return RunModel(pretrained, config, tokenizer, name, left_to_right, carry, chosen)


def model_sizes(settings: RunSettings, pretrained: Pretrained | None) -> BertConfig:
    """The architecture, its vocabulary left to the tokenizer. With init_from the checkpoint decides the sizes; a
    `model=` asking for other sizes is an error rather than a silent choice. Dropout set on the command line still
    applies (it does not change the weights), and so does `model.initializer` (how a new head is drawn)."""
    asked = settings.model
    if pretrained is None:
        return asked
    explicit = settings.model_overrides
    # model=<size> asks for every size; model.<key>=... for that key only (an architecture field too: the block's
    # attention window, which layers attend globally).
    keys = [o.lstrip("+~").split("=", 1)[0] for o in explicit]
    given = [k.removeprefix("model.") for k in keys if k.startswith("model.")]
    named = SIZE_FIELDS if "model" in keys else given
    kept = [f for f in ARCHITECTURE_FIELDS if f in given and f != "classifier_pooling"]
    differ = [
        f for f in (*SIZE_FIELDS, *kept) if f in (*named, *kept) and getattr(asked, f) != pretrained.config.get(f)
    ]
    if differ:
        sizes = ", ".join(f"{f} {pretrained.config.get(f)} (asked {getattr(asked, f)})" for f in differ)
        raise ConfigError(
            f"init_from={settings.init_from} has other sizes than {' '.join(explicit)} asks for: {sizes}. "
            "The checkpoint sets the architecture: drop the model override"
        )
    # How a classifier pools its tokens (cls or mean) is the task head's, as transformers' from_pretrained takes it:
    # applied where the command line names it, said where it differs from the checkpoint's.
    pooling = {"classifier_pooling": asked.classifier_pooling} if "classifier_pooling" in given else {}
    if pooling and pooling["classifier_pooling"] != pretrained.config.get("classifier_pooling"):
        log.info(
            f"model.classifier_pooling={asked.classifier_pooling}: the task head pools so (init_from="
            f"{settings.init_from} has {pretrained.config.get('classifier_pooling')})"
        )
    # The dropout asked for: every rate with model=<size>, a rate named on its own (model.hidden_dropout_prob=...);
    # another key (model.initializer=...) leaves the checkpoint's rates as they are.
    regularisation = {f: getattr(asked, f) for f in REGULARISATION_FIELDS if "model" in keys or f in named}
    # How a new head's weights are drawn, where the command line names it (model.initializer=...): the checkpoint's
    # weights are not drawn, so this is the task head's choice.
    drawn = {f: getattr(asked, f) for f in INITIALIZER_FIELDS if f in named}
    # The checkpoint's architecture (its fields, checked as it was read), with the dropout and the draw asked for.
    return replace(asked, **{**pretrained.config, **regularisation, **drawn, **pooling, "vocab_size": None})


def left_to_right_because(settings: RunSettings, pretrained: Pretrained | None) -> str | None:
    """Why the model attends left to right, for the run line; None where it attends both ways. A decoder BERT
    fine-tuned on a sentence task keeps the attention it was trained with (as transformers runs it), which a user
    expecting BERT's bidirectional encoder would not guess."""
    if pretrained is None:
        return f"task.objective={settings.task.objective}" if settings.task.objective == "ltr" else None
    if pretrained.config.get("attention") != "left_to_right":
        return None
    if pretrained.hf_config.get("is_decoder"):
        return "is_decoder: true in init_from's config.json; transformers runs it so too"
    return "init_from's model was trained left to right, and fine-tuning keeps its attention"


def size_name(model: BertConfig, conf_dir: Path = CONF_DIR) -> str:
    """The conf/model/ size with these sizes (e.g. bert_base), else L<layers>-H<hidden>-A<heads>."""
    for path in sorted((conf_dir / "model").glob("*.yaml")):
        sizes = OmegaConf.to_container(OmegaConf.load(path))
        if all(getattr(model, field) == sizes.get(field) for field in SIZE_FIELDS if field in sizes):
            return path.stem
    return f"L{model.num_hidden_layers}-H{model.hidden_size}-A{model.num_attention_heads}"


def vocabulary(settings: RunSettings, start: Start, pretrained: Pretrained | None) -> tuple[Pretrained | None, dict]:
    """The tokenizer the run reads, where it is known before the data: a resumed run's own (its tokenizer.json, whose
    ids its checkpoint was trained on, whatever the corpus now holds, with the words it added), else init_from's, or
    `task.datamodule.tokenizer_path`'s when init_from came without one. Refuses, before anything is written, a
    tokenizer with more tokens than init_from has embedding rows, and what `task.datamodule.add_words` cannot do: add
    words without a checkpoint, to one whose MLM decoder is not tied to its embeddings, from a file that does not
    exist (or holds a line that is not one word). Returns the checkpoint with the tokenizer words are added to, and
    what the DataModule is given of the tokenizer (nothing where it loads or trains its own)."""
    key, add = "task.datamodule.add_words", settings.task.add_words
    if add and pretrained is None:
        raise ConfigError(
            f"{key}={add} adds words to init_from's vocabulary; without init_from the vocabulary is trained on the "
            "corpus (task.datamodule.vocab_size): set init_from=<checkpoint> or drop add_words"
        )
    tokenizer = pretrained.tokenizer if pretrained is not None else None
    if pretrained is not None and tokenizer is None and settings.task.tokenizer_path:  # as its DataModule loads it
        try:
            tokenizer = load_tokenizer(settings.task.tokenizer_path, lowercase=settings.task.lowercase)
        except UserError as error:
            raise ConfigError(f"task.datamodule.tokenizer_path: {error}") from None
        pretrained = replace(pretrained, tokenizer=tokenizer)
    own = settings.output_dir / "tokenizer.json"
    resumed = load_tokenizer(own) if start.resuming and own.is_file() else None
    if pretrained is not None and tokenizer is not None:
        rows = pretrained.config["vocab_size"]
        if tokenizer.vocab_size > rows:
            raise UserError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but init_from={pretrained.source} embeds only "
                f"{rows}; use the tokenizer that came with the checkpoint"
            )
        if add and not start.resuming:  # a resumed run's tokenizer.json holds its words already
            check_added_words_fit(pretrained, tokenizer, key)
            if isinstance(add, str):
                read_word_file(add, tokenizer)  # a missing file, a line of two words: said now, not after the record
    if resumed is not None:  # its words are the ones added when the run began: none are added again
        return pretrained, {"tokenizer": resumed} | ({"add_words": None} if add is not None else {})
    return pretrained, {"tokenizer": tokenizer} if tokenizer is not None else {}


def check_head(settings: RunSettings, pretrained: Pretrained) -> None:
    """Refuses, before anything is written, a checkpoint whose head is not the task's, or whose labels are not the
    task's: evaluating it would score a head that starts untrained, or name its predictions wrongly."""
    wanted = task_head(settings.task.module_class, settings.task.module_arguments)
    if wanted is None:
        return  # pre-training is evaluated on its own heads; the fresh-weights check after loading still holds
    head, arguments = wanted
    task = f"task={settings.task.option or '...'}"
    found = head_of(pretrained)
    if found is not None and found[0] == head.name:
        if carry_head(pretrained, head, arguments).carry:
            return
        if head.labelled:
            raise UserError(
                f"init_from={settings.init_from} is a {head.name.replace('_', ' ')} model with the labels "
                f"{list(found[1].labels)}, and {task} evaluates the labels {list(arguments.labels)}; evaluate a model "
                "fine-tuned on this label set (its names may be in any order)"
            )
    what = f"a {found[0].replace('_', ' ')} model" if found else "a pre-trained model without a fine-tuned head"
    raise UserError(
        f"init_from={settings.init_from} is {what}, and {task} evaluates a {head.name.replace('_', ' ')} head of its "
        "own; evaluate a model fine-tuned for this task (its run directory or .ckpt)"
    )
