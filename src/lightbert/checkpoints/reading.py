"""Reading any checkpoint a run starts from (`init_from=`): a lightbert .ckpt or run directory, a Hugging Face BERT
directory, or a hub id; and loading its weights into a model (the encoder, and a head where it fits or is carried).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from lightbert.checkpoints import sentence_transformers
from lightbert.checkpoints.hf_format import (
    HF_TOKENIZER_FILES,
    HF_WEIGHT_FILES,
    HUB_ID,
    HUB_PATTERNS,
    checked_config,
    hf_config_to_lightbert,
    hf_lowercase,
    hf_state_dict_to_lightbert,
)
from lightbert.data.tokenizer import BertTokenizer, load_tokenizer
from lightbert.errors import UserError
from lightbert.files import RESULTS_FILE
from lightbert.hub import hub_reachable
from lightbert.model import BertConfig, BertModel

log = logging.getLogger(__name__)


@dataclass
class Pretrained:
    """What a checkpoint holds: the architecture, weights under lightbert names, and its tokenizer."""

    config: dict  # BertConfig fields
    state_dict: dict[str, torch.Tensor]  # "bert.*", and "cls.*" / "classifier.*" heads when present
    tokenizer: BertTokenizer | None
    source: str
    # What says which head a fine-tuned checkpoint has: a lightbert checkpoint's task-module arguments, a Hugging
    # Face directory's config.json; and the run directory a lightbert checkpoint came from (its settings, .hydra/).
    hyper_parameters: dict = field(default_factory=dict)
    hf_config: dict = field(default_factory=dict)
    run_dir: Path | None = None
    head: str | None = (
        None  # a lightbert checkpoint's fine-tuned head, as its module recorded it (lightbert.tasks.heads)
    )
    # A sentence-transformers directory's pooling, normalisation and max_seq_length (`sentence_transformers.read`)
    sentence: dict | None = None


def load_pretrained(init_from: str) -> Pretrained:
    """A lightbert .ckpt or run directory, a Hugging Face BERT directory, or a hub id (needs a network)."""
    check_init_from(init_from)
    path = Path(init_from).expanduser()
    if path.is_file():
        return _from_lightning_checkpoint(path)
    if path.is_dir():
        if (path / "config.json").is_file() or sentence_transformers.is_sentence_transformers_dir(path):
            return _from_model_dir(path, source=str(path))
        return _from_run_dir(path)
    return _from_hub(init_from)


def _from_model_dir(path: Path, source: str) -> Pretrained:
    """A Hugging Face directory, or a sentence-transformers one (its encoder, and how it pools and normalises)."""
    if sentence_transformers.is_sentence_transformers_dir(path):
        encoder, sentence = sentence_transformers.read(path)
        return replace(_from_hf_dir(encoder, source=source), sentence=sentence)
    return _from_hf_dir(path, source=source)


def check_init_from(init_from: str) -> None:
    """Refuses (`UserError`) an init_from that names nothing a run can start from, found without reading weights:
    a path that does not exist, a directory that is neither a model nor a run, a run without its checkpoint, a hub
    id that is neither cached nor reachable. A command that starts many runs from one (a benchmark) checks once,
    before any of them."""
    path = Path(init_from).expanduser()
    if path.is_file():
        return
    if path.is_dir():
        if (path / "config.json").is_file() or sentence_transformers.is_sentence_transformers_dir(path):
            return
        if (path / RESULTS_FILE).is_file():
            run_checkpoint(path)
            return
        raise UserError(
            f"init_from={init_from} is a directory with neither config.json (a Hugging Face model) nor "
            f"{RESULTS_FILE} (a lightbert run); point it at one of those or at a .ckpt file"
        )
    if not HUB_ID.fullmatch(init_from) or init_from.endswith(".ckpt"):
        raise UserError(
            f"init_from={init_from} does not exist; give a .ckpt file, a run directory or a model directory"
        )


def _from_lightning_checkpoint(path: Path) -> Pretrained:
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        # torch's own message ends with advice (weights_only=False) that is wrong here: a lightbert checkpoint
        # always loads with weights_only=True, so this file is not one (truncated, or something else).
        first_line = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise UserError(
            f"could not read checkpoint {path}: it is not a lightbert or Lightning checkpoint ({first_line}); "
            "point init_from at a run directory, a .ckpt it wrote, or a Hugging Face directory"
        ) from None
    model = (checkpoint.get("hyper_parameters") or {}).get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(model, dict) or "state_dict" not in checkpoint:
        raise UserError(f"{path} is not a lightbert checkpoint (no state_dict or model hyperparameters)")
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    # A run keeps tokenizer.json in its run directory; checkpoints sit in <run>/checkpoints/.
    tokenizer, run_dir = None, None
    for directory in (path.parent, path.parent.parent):
        if (directory / "tokenizer.json").is_file():
            tokenizer, run_dir = load_tokenizer(directory / "tokenizer.json"), directory
            break
    hyper_parameters = {k: v for k, v in checkpoint["hyper_parameters"].items() if k not in ("model", "optim")}
    head = checkpoint.get("head")
    return Pretrained(
        checked_config(model, path), state, tokenizer, str(path), hyper_parameters, run_dir=run_dir, head=head
    )


def run_checkpoint(path: Path) -> tuple[str, Path]:
    """The checkpoint a finished run directory starts others from (its best, else its last) and which it is, found in
    the directory itself: results.json names the files where the run was written, and a run directory is moved and
    copied (a cluster's scratch to a laptop, a renamed sweep), so each is read at its place under `path`, never at
    the recorded one. Refuses (`UserError`) a directory without that checkpoint."""
    try:
        results = json.loads((path / RESULTS_FILE).read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"could not read {path / RESULTS_FILE}: {error}; give a .ckpt file instead") from None
    which = "best" if results.get("best_checkpoint") else "last"
    recorded = results.get("best_checkpoint") or results.get("last_checkpoint")
    if not recorded:
        raise UserError(f"the run in {path} saved no checkpoint ({RESULTS_FILE} names none); give a .ckpt file instead")
    checkpoint = path / _within_run(Path(recorded), results.get("output_dir"))
    if not checkpoint.is_file():
        raise UserError(
            f"the run in {path} has no checkpoint on disk: its {which} checkpoint {checkpoint} is missing; copy it "
            "there with the run, or give a .ckpt file instead"
        )
    # Without its tokenizer.json (a run copied without it) it loads as a .ckpt alone does, with no tokenizer: each
    # command then asks for one in its own terms (a training run takes task.datamodule.tokenizer_path).
    return which, checkpoint


def _within_run(recorded: Path, output_dir: str | None) -> Path:
    """A file results.json records, relative to the run directory: under the directory recorded with it, else (a
    record without one, or a file kept elsewhere) in the run's checkpoints/ by its name."""
    if not recorded.is_absolute():
        return recorded
    if output_dir:
        try:
            return recorded.relative_to(output_dir)
        except ValueError:
            pass
    return Path("checkpoints") / recorded.name


def _from_run_dir(path: Path) -> Pretrained:
    which, checkpoint = run_checkpoint(path)
    log.info(f"init_from={path}: its {which} checkpoint, {checkpoint}")
    return _from_lightning_checkpoint(checkpoint)


def _from_hf_dir(path: Path, source: str) -> Pretrained:
    try:
        hf_config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"could not read {path / 'config.json'}: {error}") from None
    config = hf_config_to_lightbert(hf_config, path / "config.json")
    present = [path / name for name in HF_WEIGHT_FILES if (path / name).is_file()]
    if not present:
        raise UserError(f"{path} holds no weights: expected one of {list(HF_WEIGHT_FILES)}")
    weights = present[0]  # model.safetensors first, as transformers' from_pretrained prefers it
    if len(present) > 1:  # the two may hold different weights (one left from an older save): say which is read
        others = ", ".join(p.name for p in present[1:])
        log.info(
            f"{source}: read {weights.name}, not {others} (both are there; safetensors first, as transformers does)"
        )
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            raw = load_file(str(weights))
        else:
            raw = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(f"could not read weights {weights}: {error}") from None
    tokenizer_file = next((path / name for name in HF_TOKENIZER_FILES if (path / name).is_file()), None)
    tokenizer = load_tokenizer(tokenizer_file, lowercase=hf_lowercase(path)) if tokenizer_file else None
    return Pretrained(config, hf_state_dict_to_lightbert(raw, hf_config), tokenizer, source, hf_config=hf_config)


def _from_hub(repo_id: str) -> Pretrained:
    hub_reachable()  # offline at once where the hub's host does not resolve, not after retries
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id, allow_patterns=HUB_PATTERNS)
    except Exception as error:
        raise UserError(
            f"init_from={repo_id} is not a local path, and downloading it from the Hugging Face hub failed "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); without a network, "
            "download the model elsewhere and pass its directory"
        ) from None
    return _from_model_dir(Path(local), source=repo_id)


@dataclass(frozen=True)
class HeadCarry:
    """Whether a checkpoint's fine-tuned head goes into a task's model (lightbert.tasks.heads.carry_head
    decides, by what the head means: its kind and its labels).

    `rows` puts the checkpoint's label rows in the task's label order (row i of the task is row rows[i] of the
    checkpoint); None keeps them as stored. `label_layer` is the head's last layer, whose rows are the labels.
    """

    carry: bool
    rows: tuple[int, ...] | None = None
    label_layer: str = "classifier"
    line: str = ""  # what the console says of it

    def weights(self, key: str, value: torch.Tensor) -> torch.Tensor:
        if self.rows is not None and key in (f"{self.label_layer}.weight", f"{self.label_layer}.bias"):
            return value[list(self.rows)]
        return value


# The masked-LM head's dense -> GELU -> LayerNorm, and where the modern encoder's task heads have the same module:
# a sentence head's pooler (`pooler: head`), a token-level head's `head`. transformers names all of them `head`
# (ModernBertPredictionHead), so its ModernBertFor<Task>.from_pretrained of a ModernBertForMaskedLM starts the task's
# from the masked-LM head's.
MLM_TRANSFORM = "cls.predictions.transform."
TASK_TRANSFORMS = ("bert.pooler.", "head.")


def from_mlm_transform(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each weight of a modern task head's dense and LayerNorm (in `expected`) -> the checkpoint's masked-LM transform
    weight that starts it, where the checkpoint (`state`) holds that transform whole and not the head's own; {} for
    BERT (its tanh pooler has no LayerNorm; NSP trained it) and for a checkpoint without a masked-LM head."""
    for prefix in TASK_TRANSFORMS:
        keys = [k for k in expected if k.startswith((f"{prefix}dense.", f"{prefix}LayerNorm."))]
        if not any(k.startswith(f"{prefix}LayerNorm.") for k in keys) or any(k in state for k in keys):
            continue
        sources = {k: MLM_TRANSFORM + k.removeprefix(prefix) for k in keys}
        if all(s in state and state[s].shape == expected[k].shape for k, s in sources.items()):
            return sources
    return {}


def load_into(
    model: torch.nn.Module, pretrained: Pretrained, head: HeadCarry | None = None, say: bool = True
) -> list[str]:
    """Copy the checkpoint's weights into `model`: the whole encoder, and its heads.

    With `head`, a fine-tuned head (any weight outside `bert.` and the pre-training heads `cls.`) is carried as it
    says, and its console line is said; without, every head whose shape fits is carried (the pre-training heads, or
    a fine-tuned model's own). A modern task head's dense -> GELU -> LayerNorm the checkpoint lacks starts from its
    masked-LM head's (`from_mlm_transform`), as transformers' from_pretrained does. Returns the names of parameters
    left as initialised (a new task head). The encoder must match exactly. Without `say` the caller says what starts
    fresh (pre-training: `lightbert.tasks.pretraining.continued.carried_line`).
    """
    expected = model.state_dict()
    from_mlm = from_mlm_transform(expected, pretrained.state_dict)
    if from_mlm and say:
        part = next(p for p in TASK_TRANSFORMS if next(iter(from_mlm)).startswith(p))
        started = (
            f"its dense -> GELU -> LayerNorm ({part}dense, {part}LayerNorm), which start from {pretrained.source}'s "
            f"masked-LM head ({MLM_TRANSFORM}*), as transformers' from_pretrained starts them"
        )
        log.info(
            f"{head.line}, all but {started}" if head is not None else f"the task head starts fresh, all but {started}"
        )
    elif head is not None and say:
        log.info(head.line)
    encoder_keys = {k for k in expected if k.startswith("bert.")}
    missing = sorted(encoder_keys - set(pretrained.state_dict) - set(from_mlm))
    pooler = [k for k in missing if k.startswith("bert.pooler.")]
    if pooler and len(pooler) == len(missing):
        # A model trained without a sentence-level head (a SQuAD or NER fine-tune, pre-training without NSP) starts a
        # classifier: its pooler starts fresh, like the head.
        (log.warning if say else log.debug)(
            "%s has no pooler (it was trained without a sentence-level head: a span or token classifier, or "
            "pre-training without NSP): the pooler starts fresh",
            pretrained.source,
        )
        encoder_keys -= set(pooler)
        missing = []
    if missing:
        raise UserError(
            f"{pretrained.source} lacks {len(missing)} encoder weight(s), e.g. {missing[:3]}; it is not a BERT "
            "checkpoint lightbert can start from"
        )
    usable = {}
    for key, value in pretrained.state_dict.items():
        if key not in expected:
            continue
        if head is not None and not key.startswith(("bert.", "cls.")):
            if not head.carry:
                continue
            value = head.weights(key, value)
        if value.shape != expected[key].shape:
            if key in encoder_keys:
                raise UserError(
                    f"{pretrained.source} does not fit the model: {key} is {tuple(value.shape)} in the checkpoint "
                    f"but {tuple(expected[key].shape)} here; its config and weights disagree"
                )
            continue  # a head of another size (e.g. 3 labels where this task has 2): start it fresh
        usable[key] = value
    usable.update({key: pretrained.state_dict[source] for key, source in from_mlm.items()})
    model.load_state_dict(usable, strict=False)
    tied = "cls.predictions.decoder.weight"  # loaded through the word embeddings it shares
    fresh = sorted(k for k in expected if k not in usable and k != tied)
    if fresh and head is None and say:  # with `head`, its console line says what starts fresh and why
        log.info("initialised fresh, not in %s: %s", pretrained.source, ", ".join(fresh))
    return fresh


def load_encoder(pretrained: Pretrained, add_pooling_layer: bool = False) -> BertModel:
    """The checkpoint's encoder alone, in eval mode: for extracted features and attention maps."""

    class _Holder(torch.nn.Module):  # load_into fills the encoder found under `bert.`, as in every head
        def __init__(self, bert: BertModel):
            super().__init__()
            self.bert = bert

    holder = _Holder(BertModel(BertConfig.from_dict(pretrained.config), add_pooling_layer))
    load_into(holder, pretrained)
    return holder.bert.eval()
