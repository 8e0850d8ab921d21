"""Convert checkpoints between lightbert and Hugging Face.

    python -m lightbert.interop.convert to-hf   outputs/pretrain/runs/<run>      exported/      # or a .ckpt file
    python -m lightbert.interop.convert to-onnx outputs/sst2/runs/<run>          onnx/          # needs the onnx extra
    python -m lightbert.interop.convert from-hf path/to/hf-bert-dir              imported/      # or a hub id

`to-hf` writes config.json, model.safetensors and the tokenizer (tokenizer.json, vocab.txt,
tokenizer_config.json). A pre-training checkpoint loads with `transformers.BertForPreTraining.from_pretrained`; a
fine-tuned one with its head's class and `AutoModelFor...` (sequence classification with id2label / label2id, token
classification, question answering, multiple choice) and with `transformers.pipeline`; a sentence embedding model
(task=embedding) with `transformers.AutoModel` and, through the sentence-transformers files written beside it
(modules.json, 1_Pooling/), with `sentence_transformers.SentenceTransformer`.
`to-onnx` writes encoder.onnx, model.onnx for a fine-tuned head, config.json and the tokenizer
(lightbert.interop.onnx_export).
`from-hf` writes model.ckpt and tokenizer.json: use the directory's model.ckpt as `init_from=`, or the
Hugging Face directory itself, which `init_from=` reads directly.
The output directory must be new or empty, not a mount point, in a place you can write; it is checked before
anything is read and appears only once fully written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightbert.checkpoints.reading import load_pretrained
from lightbert.errors import exits_on_user_error
from lightbert.interop.hf import check_export_dir, export_hf, hf_head_config, import_hf, pretraining_head_config
from lightbert.tasks.finetuned import finetuned_from
from lightbert.tasks.heads import HEADS, head_of


def to_hf(checkpoint: str, out_dir: str) -> Path:
    """A pre-training checkpoint as `BertForPreTraining`; a fine-tuned one as its head's class."""
    check_export_dir(Path(out_dir).expanduser())  # before a checkpoint of gigabytes is read
    pretrained = load_pretrained(checkpoint)
    if head_of(pretrained) is None:
        return export_hf(pretrained, out_dir, pretraining_head_config(pretrained))
    finetuned = finetuned_from(pretrained, checkpoint)
    sentence = None
    if HEADS[finetuned.head].sentence_embedding:  # sentence-transformers' files too
        model = finetuned.model
        sentence = {"pooling": model.pooling, "normalize": model.normalize, **finetuned.settings}
    return export_hf(pretrained, out_dir, hf_head_config(finetuned), finetuned.model.state_dict(), sentence)


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightbert.interop.convert", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_hf_command = commands.add_parser("to-hf", help="lightbert checkpoint (.ckpt or run dir) -> Hugging Face dir")
    to_hf_command.add_argument("checkpoint")
    to_hf_command.add_argument("out_dir")
    to_onnx_command = commands.add_parser(
        "to-onnx", help="lightbert checkpoint -> encoder.onnx (+ model.onnx for a fine-tuned head), needs [onnx]"
    )
    to_onnx_command.add_argument("checkpoint")
    to_onnx_command.add_argument("out_dir")
    from_hf = commands.add_parser("from-hf", help="Hugging Face directory or hub id -> lightbert checkpoint dir")
    from_hf.add_argument("source")
    from_hf.add_argument("out_dir")
    args = parser.parse_args(argv)
    if args.command == "to-hf":
        out = to_hf(args.checkpoint, args.out_dir)
    elif args.command == "to-onnx":
        from lightbert.interop.onnx_export import export_onnx  # torch.onnx loads only when asked for

        out = export_onnx(args.checkpoint, args.out_dir)
    else:
        check_export_dir(Path(args.out_dir).expanduser())  # before a model is read or downloaded
        out = import_hf(load_pretrained(args.source), args.out_dir)
    print(f"lightbert: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
