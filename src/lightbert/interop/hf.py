"""Hugging Face directories out of lightbert checkpoints and back (`python src/convert.py to-hf / from-hf`): the
format's conversions are `hf_format`'s; what a checkpoint holds is read by lightbert.checkpoints."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import torch

from lightbert.checkpoints import sentence_transformers
from lightbert.checkpoints.hf_format import (
    hf_family,
    lightbert_config_to_hf,
    lightbert_config_to_modernbert,
    lightbert_state_dict_to_hf,
    lightbert_state_dict_to_modernbert,
    write_tokenizer_files,
)
from lightbert.checkpoints.reading import Pretrained, load_into
from lightbert.errors import UserError
from lightbert.files import publish_directory, readable_as_usual
from lightbert.model import BertConfig, BertForPreTraining
from lightbert.tasks.finetuned import FineTuned
from lightbert.tasks.heads import HEADS


def check_export_dir(out_dir: Path) -> None:
    """Refuses (`UserError`, one line) an output directory an export cannot be published as, before anything is read
    or written: a file, a directory that is not empty, a mount point, or a place nobody may write in. The export is
    written into a temporary directory beside `out_dir` (with the parents it lacks), then renamed into place."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file; give a new directory to write into (nothing was written)")
    if out_dir.is_dir():
        try:
            empty = not any(out_dir.iterdir())
        except OSError as error:
            raise UserError(f"cannot read {out_dir} ({error.strerror}); choose a new output directory") from None
        if not empty:
            raise UserError(f"{out_dir} exists and is not empty; choose a new output directory (nothing was written)")
        if os.path.ismount(out_dir) and not os.access(out_dir, os.W_OK | os.X_OK):
            raise UserError(
                f"{out_dir} is a read-only mount point (or one you cannot write in); give an output directory where "
                "you can write (nothing was written)"
            )
        if os.path.ismount(out_dir):
            raise UserError(
                f"{out_dir} is a mount point, which an export cannot be renamed onto; give a new directory inside it, "
                f"e.g. {out_dir / 'model'} (nothing was written)"
            )
    place = out_dir.absolute().parent
    while not place.exists():
        place = place.parent
    if not place.is_dir():
        raise UserError(f"{place} is a file, not a directory; give an output directory elsewhere (nothing was written)")
    if not os.access(place, os.W_OK | os.X_OK):
        raise UserError(
            f"cannot write in {place} (a read-only file system, or no permission); give an output directory where "
            "you can write (nothing was written)"
        )


def publish_export(out_dir: Path, write: Callable[[Path], None]) -> Path:
    """`files.publish_directory` for an export, all or nothing: a write that fails after `check_export_dir` (a disk
    that fills up) ends in one line, and no directory it made is left."""
    from safetensors import SafetensorError  # safetensors' own error for a write that failed (a full disk)

    made = [p for p in (out_dir.absolute(), *out_dir.absolute().parents) if not p.exists()]
    try:
        publish_directory(out_dir, write)
    except (OSError, SafetensorError) as error:
        for directory in made[1:]:  # the parents the temporary directory was made in, innermost first
            with suppress(OSError):
                directory.rmdir()
        why = f"{error.strerror} ({error.filename})" if isinstance(error, OSError) and error.strerror else str(error)
        raise UserError(f"could not write {out_dir}: {why}; nothing was written") from None
    return out_dir


def export_hf(
    pretrained: Pretrained,
    out_dir: str | Path,
    head_config: dict | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    sentence: dict | None = None,
) -> Path:
    """Write a Hugging Face directory that `transformers.BertForPreTraining.from_pretrained` loads or, with a
    fine-tuned head's `head_config` (architectures, labels) and weights, the matching `AutoModelFor...`. The modern
    encoder (`hf_family`) is written as transformers' ModernBERT, its classes named in `head_config` as BERT's. With
    `sentence` (a sentence embedding model's pooling, normalize and max_seq_length), sentence-transformers' files are
    written beside the encoder, so that `SentenceTransformer` loads the directory too."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir).expanduser()
    if pretrained.tokenizer is None:
        raise UserError(f"{pretrained.source} has no tokenizer.json next to it; an exported model needs one")
    modern = hf_family(pretrained.config, pretrained.source) == "modernbert"
    check_export_dir(out_dir)

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        weights = pretrained.state_dict if state_dict is None else state_dict
        if modern:
            head = {**(head_config or {})}
            head.pop("architectures", None)
            bert_class = ((head_config or {}).get("architectures") or ["BertForMaskedLM"])[0]
            architecture = "Modern" + bert_class
            config = {
                **lightbert_config_to_modernbert(pretrained.config, pretrained.tokenizer),
                **head,
                "architectures": [architecture],
            }
            state = lightbert_state_dict_to_modernbert(weights, architecture)
        else:
            config = {**lightbert_config_to_hf(pretrained.config), **(head_config or {})}
            state = lightbert_state_dict_to_hf(weights)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        readable_as_usual(tmp / "model.safetensors")  # safetensors writes it 0600, unlike every other file here
        # A fine-tuned model's inputs are cut where its run cut them (predict.py does): AutoTokenizer's
        # truncation=True (a pipeline's) cuts there too. Otherwise at the position embeddings' length.
        trained = ((head_config or {}).get("lightbert") or {}).get("settings", {}).get("max_seq_length")
        length = trained or pretrained.config["max_position_embeddings"]
        write_tokenizer_files(pretrained.tokenizer, tmp, length, modern)
        if sentence is not None:
            pooling, normalize, length = sentence["pooling"], sentence["normalize"], sentence["max_seq_length"]
            sentence_transformers.write(tmp, pooling, normalize, length, pretrained.config["hidden_size"])

    return publish_export(out_dir, write)  # all or nothing: an interrupted export leaves no half directory


def import_hf(pretrained: Pretrained, out_dir: str | Path) -> Path:
    """Write a lightbert checkpoint directory: `model.ckpt` (pre-training module) and `tokenizer.json`.

    The checkpoint loads with `PreTrainingModule.load_from_checkpoint` and as `init_from=` on every task.
    """
    import lightning

    out_dir = Path(out_dir).expanduser()
    check_export_dir(out_dir)

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        # Through the real module, so the checkpoint holds exactly its keys (the tied decoder included).
        config = BertConfig.from_dict(pretrained.config)
        # The modern recipe has no NSP head (ModernBertForMaskedLM): none is made up for it.
        next_sentence = config.pooler == "tanh" or "cls.seq_relationship.weight" in pretrained.state_dict
        model = BertForPreTraining(config, next_sentence=next_sentence)
        load_into(model, pretrained)
        state = {"model." + k: v for k, v in model.state_dict().items()}
        checkpoint = {
            "state_dict": state,
            "hyper_parameters": {"model": pretrained.config, "optim": {}, "sparse_mlm_head": True},
            "pytorch-lightning_version": lightning.__version__,
            "lightbert_source": pretrained.source,
        }
        torch.save(checkpoint, tmp / "model.ckpt")
        if pretrained.tokenizer is not None:
            pretrained.tokenizer.save(tmp / "tokenizer.json")

    return publish_export(out_dir, write)


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
    """config.json's architecture for a pre-trained model of each objective (lightbert.tasks.pretraining.objectives):
    MLM + NSP is `BertForPreTraining`, MLM alone `BertForMaskedLM`, the left-to-right LM `BertLMHeadModel` as a
    decoder (its causal self-attention is this model's)."""
    if BertConfig.from_dict(pretrained.config).causal:
        return {"architectures": ["BertLMHeadModel"], "is_decoder": True}
    if "cls.seq_relationship.weight" not in pretrained.state_dict:
        return {"architectures": ["BertForMaskedLM"]}
    return {}
