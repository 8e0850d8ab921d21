"""Checkpoints in and out: lightbert Lightning checkpoints, Hugging Face BERT directories, hub ids.

lightbert keeps Hugging Face's parameter names (see model/bert.py), so a state dict maps one-to-one. The only
differences are bookkeeping:
- a Lightning checkpoint prefixes every key with the LightningModule's attribute (`model.`);
- Hugging Face may store `cls.predictions.decoder.weight` (the tied word embeddings) and
  `cls.predictions.decoder.bias` (the same tensor as `cls.predictions.bias`); lightbert ties both itself;
- Google's TF-converted checkpoints name LayerNorm parameters `gamma`/`beta`, and a `BertModel` checkpoint
  has no `bert.` prefix.

`load_pretrained(init_from)` is what `init_from=` on every task calls; `export_hf` and `import_hf` back
`python -m lightbert.interop.convert`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from lightbert.data.tokenizer import SPECIAL_TOKENS, BertTokenizer, load_tokenizer
from lightbert.errors import UserError
from lightbert.files import RESULTS_FILE, publish_directory, readable_as_usual
from lightbert.hub import hub_reachable
from lightbert.model import BertConfig, BertForPreTraining, BertModel

log = logging.getLogger(__name__)

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")  # "bert-base-uncased", "google-bert/bert-base-uncased"
_HUB_PATTERNS = ["config.json", *HF_WEIGHT_FILES, *HF_TOKENIZER_FILES, "tokenizer_config.json"]
_CONFIG_KEYS = {f.name for f in fields(BertConfig)}


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
    head: str | None = None  # a lightbert checkpoint's fine-tuned head, as its module recorded it (lightbert.heads)


# -- reading -----------------------------------------------------------------------------------------------


def load_pretrained(init_from: str) -> Pretrained:
    """A lightbert .ckpt or run directory, a Hugging Face BERT directory, or a hub id (needs a network)."""
    path = Path(init_from).expanduser()
    if path.is_file():
        return _from_lightning_checkpoint(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return _from_hf_dir(path, source=str(path))
        if (path / RESULTS_FILE).is_file():
            return _from_run_dir(path)
        raise UserError(
            f"init_from={init_from} is a directory with neither config.json (a Hugging Face model) nor "
            f"{RESULTS_FILE} (a lightbert run); point it at one of those or at a .ckpt file"
        )
    if not HUB_ID.fullmatch(init_from) or init_from.endswith(".ckpt"):
        raise UserError(
            f"init_from={init_from} does not exist; give a .ckpt file, a run directory or a model directory"
        )
    return _from_hub(init_from)


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
        _checked_config(model, path), state, tokenizer, str(path), hyper_parameters, run_dir=run_dir, head=head
    )


def _from_run_dir(path: Path) -> Pretrained:
    results = json.loads((path / RESULTS_FILE).read_text())
    which = "best" if results.get("best_checkpoint") else "last"
    checkpoint = results.get("best_checkpoint") or results.get("last_checkpoint")
    if not checkpoint or not Path(checkpoint).is_file():
        raise UserError(f"the run in {path} has no checkpoint on disk; give a .ckpt file instead")
    log.info(f"init_from={path}: its {which} checkpoint, {checkpoint}")
    return _from_lightning_checkpoint(Path(checkpoint))


def _from_hf_dir(path: Path, source: str) -> Pretrained:
    try:
        hf_config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"could not read {path / 'config.json'}: {error}") from None
    config = hf_config_to_lightbert(hf_config, path / "config.json")
    weights = next((path / name for name in HF_WEIGHT_FILES if (path / name).is_file()), None)
    if weights is None:
        raise UserError(f"{path} holds no weights: expected one of {list(HF_WEIGHT_FILES)}")
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            raw = load_file(str(weights))
        else:
            raw = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(f"could not read weights {weights}: {error}") from None
    tokenizer_file = next((path / name for name in HF_TOKENIZER_FILES if (path / name).is_file()), None)
    tokenizer = load_tokenizer(tokenizer_file, lowercase=_hf_lowercase(path)) if tokenizer_file else None
    return Pretrained(config, hf_state_dict_to_lightbert(raw), tokenizer, source, hf_config=hf_config)


def _from_hub(repo_id: str) -> Pretrained:
    hub_reachable()  # offline at once where the hub's host does not resolve, not after retries
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS)
    except Exception as error:
        raise UserError(
            f"init_from={repo_id} is not a local path, and downloading it from the Hugging Face hub failed "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); without a network, "
            "download the model elsewhere and pass its directory"
        ) from None
    return _from_hf_dir(Path(local), source=repo_id)


def _checked_config(values: dict, where: Path) -> dict:
    try:
        return BertConfig.from_dict(values).to_dict()
    except UserError as error:
        raise UserError(f"{where}: {error}") from None


def _hf_lowercase(path: Path) -> bool:
    """`do_lower_case` from tokenizer_config.json (applies to a bare vocab.txt); BERT's default is True."""
    try:
        return bool(json.loads((path / "tokenizer_config.json").read_text()).get("do_lower_case", True))
    except (OSError, json.JSONDecodeError):
        return True


def hf_config_to_lightbert(hf_config: dict, where: Path | str = "config.json") -> dict:
    """A Hugging Face BERT config.json as lightbert's BertConfig fields; what lightbert cannot run as transformers
    runs it is refused here, in one line naming the value found and what is supported."""
    model_type = hf_config.get("model_type", "bert")
    if model_type != "bert":
        raise UserError(f"{where} has model_type {model_type!r}; lightbert loads BERT models only (model_type 'bert')")
    if hf_config.get("hidden_act", "gelu") != "gelu":
        raise UserError(f"{where}: hidden_act {hf_config['hidden_act']!r} is not supported (lightbert uses gelu)")
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise UserError(
            f"{where}: position_embedding_type {position!r} is not supported; lightbert runs absolute position "
            "embeddings only"
        )
    if hf_config.get("add_cross_attention"):
        raise UserError(
            f"{where}: add_cross_attention is true (the decoder of an encoder-decoder model); lightbert runs BERT "
            "encoders and left-to-right BERT models without cross-attention"
        )
    values = {k: v for k, v in hf_config.items() if k in _CONFIG_KEYS}
    values["pad_token_id"] = values.get("pad_token_id") or 0
    if hf_config.get("is_decoder"):
        # transformers runs a decoder BERT (BertLMHeadModel) left to right; so does lightbert's left_to_right model,
        # whose own export writes is_decoder. Read bidirectionally it would give other outputs without a word.
        if values.get("attention", "left_to_right") != "left_to_right":
            raise UserError(
                f"{where}: is_decoder is true but attention is {values['attention']!r}; a decoder attends "
                "left_to_right: remove one of the two"
            )
        values["attention"] = "left_to_right"
    return _checked_config(values, Path(where))


def hf_state_dict_to_lightbert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key.startswith(("embeddings.", "encoder.", "pooler.")):  # a bare BertModel checkpoint
            key = "bert." + key
        if key.endswith("position_ids") or key.startswith("cls.predictions.decoder."):
            continue  # a buffer, and the tied decoder weight/bias (lightbert ties them itself)
        out[key] = value
    return out


@dataclass(frozen=True)
class HeadCarry:
    """Whether a checkpoint's fine-tuned head goes into a task's model (lightbert.inference.finetuned.carry_head
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


def load_into(model: torch.nn.Module, pretrained: Pretrained, head: HeadCarry | None = None) -> list[str]:
    """Copy the checkpoint's weights into `model`: the whole encoder, and its heads.

    With `head`, a fine-tuned head (any weight outside `bert.` and the pre-training heads `cls.`) is carried as it
    says; without, every head whose shape fits is carried (the pre-training heads, or a fine-tuned model's own).
    Returns the names of parameters left as initialised (a new task head). The encoder must match exactly.
    """
    expected = model.state_dict()
    encoder_keys = {k for k in expected if k.startswith("bert.")}
    missing = sorted(encoder_keys - set(pretrained.state_dict))
    pooler = [k for k in missing if k.startswith("bert.pooler.")]
    if pooler and len(pooler) == len(missing):
        # A model trained without a sentence-level head (a SQuAD or NER fine-tune, pre-training without NSP) starts a
        # classifier: its pooler starts fresh, like the head.
        log.warning(
            "%s has no pooler (it was trained without a sentence-level head: SQuAD, NER, or pre-training without "
            "NSP): the pooler starts fresh",
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
    model.load_state_dict(usable, strict=False)
    tied = "cls.predictions.decoder.weight"  # loaded through the word embeddings it shares
    fresh = sorted(k for k in expected if k not in usable and k != tied)
    if fresh and head is None:  # with `head`, its console line says what starts fresh and why
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


# -- writing -----------------------------------------------------------------------------------------------


def lightbert_config_to_hf(config: dict) -> dict:
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        **config,
    }


def lightbert_state_dict_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage: drop the tied decoder weight (transformers re-ties it on load).
    return {k: v.detach().contiguous().clone() for k, v in state.items() if k != "cls.predictions.decoder.weight"}


def write_tokenizer_files(tokenizer: BertTokenizer, directory: Path, max_length: int) -> None:
    tokenizer.save(directory / "tokenizer.json")
    tokenizer.save_vocab_txt(directory / "vocab.txt")
    normalizer = json.loads(tokenizer.backend.to_str()).get("normalizer") or {}
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(normalizer.get("lowercase", True)),
        "model_max_length": max_length,
        **dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS, strict=True)),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def check_export_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file; give a new directory to write into (nothing was written)")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir} exists and is not empty; choose a new output directory (nothing was written)")


def export_hf(
    pretrained: Pretrained,
    out_dir: str | Path,
    head_config: dict | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a Hugging Face directory that `transformers.BertForPreTraining.from_pretrained` loads or, with a
    fine-tuned head's `head_config` (architectures, labels) and weights, the matching `AutoModelFor...`."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir).expanduser()
    if pretrained.tokenizer is None:
        raise UserError(f"{pretrained.source} has no tokenizer.json next to it; an exported model needs one")
    check_export_dir(out_dir)

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        config = {**lightbert_config_to_hf(pretrained.config), **(head_config or {})}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        state = lightbert_state_dict_to_hf(pretrained.state_dict if state_dict is None else state_dict)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        readable_as_usual(tmp / "model.safetensors")  # safetensors writes it 0600, unlike every other file here
        write_tokenizer_files(pretrained.tokenizer, tmp, pretrained.config["max_position_embeddings"])

    publish_directory(out_dir, write)  # all or nothing: an interrupted export leaves no half directory
    return out_dir


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
        model = BertForPreTraining(BertConfig.from_dict(pretrained.config))
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

    publish_directory(out_dir, write)
    return out_dir
