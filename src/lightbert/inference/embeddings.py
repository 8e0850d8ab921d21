"""Contextual embeddings from a pre-trained BERT, written as google-research/bert's `extract_features.py` writes them.

Each input line is a text, or a pair "text a ||| text b". Its output line is

    {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}

with one entry per WordPiece token ([CLS] and [SEP] included) and, per chosen layer, that token's hidden vector,
rounded to 6 decimals as the reference does. Layer indices count encoder layers python-style, as the reference
does: -1 is the last layer, 0 the first; the embedding output is not one of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from lightbert.checkpoints.reading import load_encoder, load_pretrained
from lightbert.data.batches import pad_batch
from lightbert.data.encoding import encode_truncated
from lightbert.data.tokenizer import BertTokenizer
from lightbert.errors import UserError
from lightbert.files import open_atomically, read_input_text
from lightbert.model import BertModel

PAIR_SEPARATOR = " ||| "


def read_lines(input_file: Path) -> list[tuple[str, str | None]]:
    text = read_input_text(input_file)
    lines = []
    for line in text.splitlines():
        a, separator, b = line.strip().partition(PAIR_SEPARATOR.strip())
        lines.append((a.strip(), b.strip() if separator else None))
    if not lines:
        raise UserError(f"input_file={input_file} is empty; write one text (or 'a ||| b' pair) per line")
    return lines


def encode_line(tokenizer: BertTokenizer, a: str, b: str | None, max_seq_length: int) -> dict[str, list[int]]:
    """[CLS] a [SEP] (b [SEP]), cut longest-first to `max_seq_length` as in the reference."""
    second = tokenizer.encode_batch([b])[0] if b is not None else None
    ids, types = encode_truncated(
        tokenizer.encode_batch([a])[0], second, max_seq_length, tokenizer.cls_id, tokenizer.sep_id
    )
    return {"input_ids": ids, "token_type_ids": types}


def checked_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    layers = list(layers)
    bad = [i for i in layers if not isinstance(i, int) or not -num_layers <= i < num_layers]
    if not layers or bad:
        raise UserError(
            f"layers={layers}: each must be an encoder layer index from {-num_layers} to {num_layers - 1} "
            f"(the model has {num_layers} layers; -1 is the last)"
        )
    return layers


def extract(
    model: BertModel,
    tokenizer: BertTokenizer,
    lines: list[tuple[str, str | None]],
    layers: Sequence[int],
    max_seq_length: int = 128,
    batch_size: int = 32,
) -> Iterator[dict]:
    """One output record per line, in order."""
    layers = checked_layers(layers, model.config.num_hidden_layers)
    device = next(model.parameters()).device
    model.eval()
    for start in range(0, len(lines), batch_size):
        rows = [encode_line(tokenizer, a, b, max_seq_length) for a, b in lines[start : start + batch_size]]
        batch = {k: v.to(device) for k, v in pad_batch(rows, tokenizer.pad_id).items()}
        with torch.no_grad():
            _, _, hidden_states = model(**batch, output_hidden_states=True)
        encoder_layers = hidden_states[1:]
        chosen = {i: encoder_layers[i].float().cpu() for i in layers}
        for offset, row in enumerate(rows):
            tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
            features = [
                {
                    "token": token,
                    "layers": [
                        {"index": i, "values": [round(x, 6) for x in chosen[i][offset, position].tolist()]}
                        for i in layers
                    ],
                }
                for position, token in enumerate(tokens)
            ]
            yield {"linex_index": start + offset, "features": features}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise UserError(f"device={name} is not known; use auto, cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device=cuda but no CUDA GPU is visible; use device=cpu")
    return torch.device(name)


@dataclass(frozen=True)
class FeatureSettings:
    """`src/extract_features.py`'s config (conf/extract_features.yaml), typed once for
    `inference.embeddings.extract_to_file`."""

    output_file: Path
    overwrite: bool
    input_file: Path
    init_from: str
    max_seq_length: int
    layers: tuple[int, ...]  # encoder layers, python-style (-1 the last); checked against the model's
    device: str  # auto, cpu or cuda
    batch_size: int

    @classmethod
    def from_config(cls, cfg: DictConfig) -> FeatureSettings:
        layers = OmegaConf.to_container(cfg.layers) if OmegaConf.is_list(cfg.layers) else [cfg.layers]
        return cls(
            output_file=Path(cfg.output_file).expanduser(),
            overwrite=bool(cfg.overwrite),
            input_file=Path(cfg.input_file).expanduser(),
            init_from=str(cfg.init_from),
            max_seq_length=cfg.max_seq_length,
            layers=tuple(layers),
            device=str(cfg.device),
            batch_size=cfg.batch_size,
        )


def extract_to_file(cfg: DictConfig) -> tuple[Path, int]:
    """What `src/extract_features.py` runs: its config typed once (`FeatureSettings`), then every line's features
    written. Returns the output file and the number of lines written."""
    settings = FeatureSettings.from_config(cfg)
    output_file = settings.output_file
    if output_file.exists() and not settings.overwrite:
        raise UserError(f"output_file={output_file} exists; choose another name or pass overwrite=true")
    lines = read_lines(settings.input_file)
    pretrained = load_pretrained(settings.init_from)
    if pretrained.tokenizer is None:
        raise UserError(f"init_from={settings.init_from} comes without a tokenizer (tokenizer.json or vocab.txt)")
    positions, max_seq_length = pretrained.config["max_position_embeddings"], settings.max_seq_length
    if max_seq_length > positions:
        raise UserError(f"max_seq_length={max_seq_length} exceeds the model's {positions} positions")
    model = load_encoder(pretrained).to(pick_device(settings.device))
    count = 0
    with open_atomically(output_file) as f:  # renamed into place when complete
        tokenizer, layers, batch_size = pretrained.tokenizer, settings.layers, settings.batch_size
        for record in extract(model, tokenizer, lines, layers, max_seq_length, batch_size):
            f.write(json.dumps(record) + "\n")
            count += 1
    return output_file, count
