"""ONNX export of a lightbert checkpoint: `python -m lightbert.interop.convert to-onnx CHECKPOINT OUT_DIR`.

OUT_DIR gets `encoder.onnx` (the shared encoder: `last_hidden_state` and, where the model has a pooler,
`pooler_output`), `model.onnx` for a fine-tuned head (`logits`, or `start_logits` and `end_logits` for question
answering), config.json with the head's labels and lightbert's settings, and the tokenizer files. Inputs are
`input_ids`, `token_type_ids` and `attention_mask` (int64), (batch, sequence) or, for multiple choice,
(batch, choices, sequence), every axis dynamic. Padding is read from `attention_mask`, as in PyTorch.

Exported through `torch.export` (torch.onnx's `dynamo=True`), with unpadding off: the ONNX graph pads, since its
shapes cannot depend on the data. Needs the `onnx` extra (`pip install -e '.[onnx]'`: onnx, onnxscript, and
onnxruntime to run the result).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from lightbert.checkpoints.hf_format import lightbert_config_to_hf, write_tokenizer_files
from lightbert.checkpoints.reading import load_encoder, load_pretrained
from lightbert.errors import UserError
from lightbert.interop.hf import check_export_dir, hf_head_config, publish_export
from lightbert.model import BertModel
from lightbert.tasks.finetuned import FineTuned, finetuned_from
from lightbert.tasks.heads import HEADS, head_of

INPUTS = ("input_ids", "token_type_ids", "attention_mask")
OPSET = 18


class EncoderOutputs(nn.Module):
    """The encoder with named tensor outputs only (ONNX has no None)."""

    def __init__(self, encoder: BertModel):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor):
        sequence_output, pooled_output, _ = self.encoder(input_ids, token_type_ids, attention_mask)
        return (sequence_output, pooled_output) if pooled_output is not None else sequence_output


def padded_model(model: nn.Module) -> nn.Module:
    """`model` with unpadding off in every encoder: the same outputs at real tokens, shapes that do not depend on
    the data (ONNX needs them static in the graph)."""
    for module in model.modules():
        if isinstance(module, BertModel):
            module.set_unpadding("off")
    return model.eval()


def example_inputs(vocab_size: int, choices: int = 0) -> tuple[torch.Tensor, ...]:
    """A small padded batch to trace with; 2 x 2 x 7 so that no axis is taken for a fixed 1."""
    shape = (2, choices, 7) if choices else (2, 7)
    input_ids = torch.randint(5, max(6, vocab_size), shape)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, ..., 5:] = 0  # the second example padded after 5 tokens
    return input_ids, torch.zeros_like(input_ids), attention_mask


def export_module(module: nn.Module, inputs: tuple[torch.Tensor, ...], outputs: list[str], path: Path) -> None:
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    axes = {0: batch, 1: torch.export.Dim("choices"), 2: sequence} if inputs[0].dim() == 3 else {0: batch, 1: sequence}
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                inputs,
                input_names=list(INPUTS),
                output_names=outputs,
                dynamic_shapes={name: axes for name in INPUTS},
                opset_version=OPSET,
                dynamo=True,
                verbose=False,
            )
        program.save(str(path))
    finally:
        quiet.setLevel(level)


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise UserError(
            "ONNX export needs the onnx extra (onnx, onnxscript, onnxruntime): pip install -e '.[onnx]'"
        ) from None


def export_onnx(checkpoint: str, out_dir: str | Path) -> Path:
    """encoder.onnx, model.onnx for a fine-tuned head, config.json and the tokenizer in `out_dir` (new or empty)."""
    _require_onnx()
    out_dir = Path(out_dir).expanduser()
    check_export_dir(out_dir)
    pretrained = load_pretrained(checkpoint)
    if pretrained.tokenizer is None:
        raise UserError(f"{pretrained.source} has no tokenizer.json next to it; an exported model needs one")
    finetuned: FineTuned | None = finetuned_from(pretrained, checkpoint) if head_of(pretrained) else None
    if finetuned is not None and (finetuned.feature_based is not None or finetuned.bilstm):
        raise UserError(
            f"{pretrained.source} has a BiLSTM (a feature-based tagger, or + BiLSTM): it reads packed sequences, "
            "which ONNX export does not take; run it with src/predict.py"
        )
    has_pooler = any(k.startswith("bert.pooler.") for k in pretrained.state_dict)
    encoder = padded_model(EncoderOutputs(load_encoder(pretrained, add_pooling_layer=has_pooler)))
    vocab_size = pretrained.config["vocab_size"]

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        encoder_outputs = ["last_hidden_state", *(["pooler_output"] if has_pooler else [])]
        export_module(encoder, example_inputs(vocab_size), encoder_outputs, tmp / "encoder.onnx")
        config = lightbert_config_to_hf(pretrained.config)
        if finetuned is not None:
            head = HEADS[finetuned.head]
            model = padded_model(finetuned.model)
            export_module(model, example_inputs(vocab_size, head.choices), list(head.onnx_outputs), tmp / "model.onnx")
            config.update(hf_head_config(finetuned))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_tokenizer_files(pretrained.tokenizer, tmp, pretrained.config["max_position_embeddings"])

    return publish_export(out_dir, write)  # all or nothing
