"""A fine-tuned model on new text: `python src/predict.py init_from=... input_file=... output_file=...`
(see docs/using-a-model.md).

One record per input line, one prediction per output line, in the input's order (an input `id` is copied over):

- sequence classification (GLUE-style): `{"text": ..., "text_pair": ...}` (the pair optional) or the task's own
  columns (`sentence`, `premise`/`hypothesis`, ...), or plain text lines -> `{"label", "probabilities"}`, or
  `{"score"}` for a regression (STS-B);
- question answering (SQuAD): `{"question", "context"}` -> `{"answer", "start", "end", "score", "no_answer"}`
  (`start`/`end`: characters of the context; v2.0 adds `null_odds`, and answers "" when they exceed the run's
  threshold, as its dev predictions did);
- token classification (NER): `{"words": [...]}` (or `tokens`), or `{"text": ...}` / plain text lines, split into
  words as BERT's pre-tokenizer splits them -> `{"words", "tags", "entities"}` (entities with character offsets
  when the input was text);
- multiple choice (SWAG): `{"context", "endings": [...]}` (an optional `start` of the next sentence), or SWAG's
  columns `sent1, sent2, ending0..3` -> `{"choice", "ending", "probabilities"}`.

Every record is encoded by the function its training used. The model runs on batches of sequences sorted by
length, each padded to its own longest only, and the encoder skips that padding too (`BertModel.unpad`): what a
record gets does not depend on the batch size or on the other records.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lightbert.data.batches import GPU_EVAL_BATCH_SIZE, pad_batch
from lightbert.data.encoding import check_max_seq_length
from lightbert.errors import UserError
from lightbert.files import open_atomically, read_input_text
from lightbert.tasks.finetuned import FineTuned, load_finetuned
from lightbert.tasks.finetuning.predictor import Predictor, Record, Unit
from lightbert.tasks.heads import HEADS


def say(message: str) -> None:
    """The console: stderr, so that `output_file=-` leaves stdout to the predictions."""
    print(f"lightbert: {message}", file=sys.stderr)


# -- records in ----------------------------------------------------------------------------------------------


def _read_stdin() -> str:
    """Standard input as UTF-8 text: one message when it is closed or holds other bytes."""
    if sys.stdin is None:
        raise UserError("input_file=- reads standard input, which is closed; give a file, or pipe the records in")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"input_file=- (standard input) is not UTF-8 text ({error})") from None


def read_records(input_file: str, input_format: str = "auto") -> tuple[list[Record], str]:
    """The non-blank lines of `input_file` (`-`: stdin) as records, and the format they were read in."""
    if input_format not in ("auto", "jsonl", "text"):
        raise UserError(f"input_format={input_format} is not known; use auto, jsonl or text")
    text = _read_stdin() if input_file == "-" else read_input_text(input_file)
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise UserError(f"input_file={input_file} holds no records; write one JSON object (or text) per line")
    if input_format == "auto":
        input_format = "jsonl" if lines[0][1].lstrip().startswith("{") else "text"
    if input_format == "text":
        return [(number, {"text": line.strip()}) for number, line in lines], "text"
    records = []
    for number, line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(
                f"input_file line {number} is not valid JSON ({error.msg}); write one object per line"
            ) from None
        if not isinstance(record, dict):
            raise UserError(f"input_file line {number} is not a JSON object; write one object per line")
        records.append((number, record))
    return records, "jsonl"


# -- running -------------------------------------------------------------------------------------------------


def length_sorted_batches(units: list[Unit], batch_size: int) -> Iterator[list[int]]:
    """Unit indices in batches of similar length (longest first), each with one number of choices."""
    order = sorted(range(len(units)), key=lambda i: (units[i].choices, -units[i].length, i))
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) == batch_size or units[batch[0]].choices != units[i].choices):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def padded(units: list[Unit], pad_id: int) -> dict[str, torch.Tensor]:
    """The batch padded to its longest sequence only; multiple choice as (B, C, T)."""
    if not units[0].choices:
        return pad_batch([{"input_ids": u.input_ids, "token_type_ids": u.token_type_ids} for u in units], pad_id)
    flat = [
        {"input_ids": i, "token_type_ids": t} for u in units for i, t in zip(u.input_ids, u.token_type_ids, strict=True)
    ]
    return {k: v.view(len(units), units[0].choices, -1) for k, v in pad_batch(flat, pad_id).items()}


# What `batch_size: auto` and `dtype: auto` (conf/predict.yaml) pick per device: a GPU takes bigger length-sorted
# batches, and runs bf16 (outputs are read as float32); a CPU keeps fp32, which its matmuls run fastest in here.
BATCH_SIZES = {"cpu": 64, "cuda": GPU_EVAL_BATCH_SIZE}
DTYPES = {"cpu": "fp32", "cuda": "bf16"}


def batch_size_for(value: int | str, device: torch.device) -> int:
    if value == "auto":
        return BATCH_SIZES.get(device.type, 64)
    if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
        raise UserError(f"batch_size={value} must be a number of sequences (at least 1) or auto")
    return int(value)


def dtype_for(value: str, device: torch.device) -> str:
    value = DTYPES.get(device.type, "fp32") if value == "auto" else str(value)
    if value not in ("fp32", "bf16"):
        raise UserError(f"dtype={value} is not known; use auto, fp32 or bf16")
    return value


def run(
    head: Predictor,
    units: list[Unit],
    batch_size: int,
    device: torch.device,
    progress: bool = False,
    dtype: str = "fp32",
) -> list[np.ndarray]:
    """Each unit's output (a sequence's own length for per-token heads); `dtype` bf16 runs under bf16 autocast."""
    from tqdm.auto import tqdm

    model = head.finetuned.model.to(device).eval()
    outputs: list[np.ndarray | None] = [None] * len(units)
    batches = list(length_sorted_batches(units, batch_size))
    per_token = head.per_token
    bf16 = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    with torch.inference_mode(), bf16:
        shown = tqdm(batches, desc="predicting", unit="batch", disable=None if progress else True, file=sys.stderr)
        for members in shown:  # a bar where stderr is a terminal
            batch = {k: v.to(device) for k, v in padded([units[i] for i in members], head.tokenizer.pad_id).items()}
            for i, row in zip(members, head.outputs(model, batch), strict=True):
                outputs[i] = row[: units[i].length].copy() if per_token else row
    return outputs


@dataclass
class Predicted:
    predictions: list[dict]
    units: int
    tokens: int
    seconds: float


def predict_records(
    finetuned: FineTuned,
    records: list[Record],
    batch_size: int = 64,
    max_seq_length: int | None = None,
    device: torch.device | str = "cpu",
    options: dict | None = None,
    progress: bool = False,
    dtype: str = "fp32",
) -> tuple[Predicted, Predictor]:
    """Every record's prediction, in order; `dtype` fp32 or bf16 (autocast). `options`: the values of the command's
    keys the head's predictor reads (`Predictor.options`)."""
    started = time.perf_counter()
    max_seq_length = max_seq_length or finetuned.settings["max_seq_length"]
    positions = finetuned.config.max_position_embeddings
    check_max_seq_length(max_seq_length, positions=positions)  # names max_seq_length, predict.yaml's own key
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size} must be at least 1")
    head = HEADS[finetuned.head].predictor(finetuned, max_seq_length, options)
    units = head.encode(records)
    outputs = run(head, units, batch_size, torch.device(device), progress, dtype_for(dtype, torch.device(device)))
    # Units come in the records' order (QA: the windows of each question in turn), whatever order they ran in.
    predictions = head.decode(records, units, outputs)
    predictions = [_ids(fields) | p for (_, fields), p in zip(records, predictions, strict=True)]
    tokens = sum(u.tokens for u in units)
    return Predicted(predictions, len(units), tokens, time.perf_counter() - started), head


def _ids(fields: dict) -> dict:
    """What names a record (`id`, GLUE's `idx`), copied to its prediction."""
    return {k: fields[k] for k in ("id", "idx") if k in fields}


@dataclass(frozen=True)
class PredictSettings:
    """`src/predict.py`'s config (conf/predict.yaml), typed once for `inference.predict.predict_to_file`. What a value
    may be is checked where the device is known (`auto` batch sizes and dtypes depend on it)."""

    output_file: str  # `-`: standard output
    overwrite: bool
    device: str  # auto, cpu or cuda
    batch_size: int | str  # sequences per batch, or auto
    dtype: str  # auto, fp32 or bf16
    input_file: str  # `-`: standard input
    input_format: str  # auto, jsonl or text
    init_from: str
    max_seq_length: int | None  # None: the run's task.max_seq_length
    options: dict[str, Any]  # the config's other keys, for the head's predictor (`Predictor.options`)

    @classmethod
    def from_config(cls, cfg: DictConfig) -> PredictSettings:
        fields = set(cls.__dataclass_fields__)
        return cls(
            output_file=str(cfg.output_file),
            overwrite=bool(cfg.overwrite),
            device=str(cfg.device),
            batch_size=cfg.batch_size,
            dtype=str(cfg.get("dtype", "auto")),
            input_file=str(cfg.input_file),
            input_format=str(cfg.input_format),
            init_from=str(cfg.init_from),
            max_seq_length=cfg.max_seq_length,
            options={k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in fields},
        )


def predict_to_file(cfg: DictConfig) -> Predicted:
    """What `src/predict.py` runs: its config typed once (`PredictSettings`), then the records read, predicted and
    written."""
    from lightbert.inference.embeddings import pick_device

    settings = PredictSettings.from_config(cfg)
    output_file = settings.output_file
    if output_file != "-" and Path(output_file).expanduser().is_dir():
        raise UserError(
            f"output_file={output_file} is a directory; give a file name, e.g. {output_file}/predictions.jsonl"
        )
    if output_file != "-" and Path(output_file).expanduser().exists() and not settings.overwrite:
        raise UserError(f"output_file={output_file} exists; choose another name or pass overwrite=true")
    if output_file == "-" and sys.stdout is None:
        raise UserError("output_file=- writes to standard output, which is closed; give a file name instead")
    device = pick_device(settings.device)
    batch_size, dtype = batch_size_for(settings.batch_size, device), dtype_for(settings.dtype, device)
    records, input_format = read_records(settings.input_file, settings.input_format)
    finetuned = load_finetuned(settings.init_from)
    head_class = HEADS[finetuned.head].predictor
    if input_format == "text" and not head_class.plain_text:
        raise UserError(
            f"input_file={settings.input_file} holds plain text lines, and init_from is {finetuned.describe()}, "
            f"which reads JSON lines: {head_class.reads}"
        )
    say(f"predicting {len(records)} record(s) with {finetuned.describe()} from {finetuned.source}")
    predicted, head = predict_records(
        finetuned,
        records,
        batch_size=batch_size,
        max_seq_length=settings.max_seq_length,
        device=device,
        options={key: settings.options.get(key) for key in head_class.options},
        progress=True,
        dtype=dtype,
    )
    for note in head.notes:
        say(note)
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predicted.predictions)
    if output_file == "-":
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        with open_atomically(Path(output_file).expanduser()) as f:  # renamed into place when complete
            f.write(lines)
    rate = len(records) / predicted.seconds if predicted.seconds > 0 else math.inf
    say(
        f"predicted {len(records)} record(s) ({predicted.units} sequence(s), {predicted.tokens} tokens) in "
        f"{predicted.seconds:.1f}s: {rate:.1f} records/s on {device.type} ({dtype}, batches of {batch_size}); "
        f"wrote {output_file}"
    )
    return predicted
