"""Convert checkpoints between lightbert and Hugging Face.

    python -m lightbert.convert to-hf   outputs/pretrain/runs/<run>      exported/      # or a .ckpt file
    python -m lightbert.convert from-hf path/to/hf-bert-dir              imported/      # or a hub id

`to-hf` writes config.json, model.safetensors and the tokenizer (tokenizer.json, vocab.txt,
tokenizer_config.json): `transformers.BertForPreTraining.from_pretrained(exported)` loads it.
`from-hf` writes model.ckpt and tokenizer.json: use the directory's model.ckpt as `init_from=`, or the
Hugging Face directory itself, which `init_from=` reads directly.
The output directory must be new or empty; it appears only once fully written.
"""

from __future__ import annotations

import argparse
import sys

from lightbert.errors import UserError
from lightbert.interop import export_hf, import_hf, load_pretrained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightbert.convert", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_hf = commands.add_parser("to-hf", help="lightbert checkpoint (.ckpt or run directory) -> Hugging Face dir")
    to_hf.add_argument("checkpoint")
    to_hf.add_argument("out_dir")
    from_hf = commands.add_parser("from-hf", help="Hugging Face directory or hub id -> lightbert checkpoint dir")
    from_hf.add_argument("source")
    from_hf.add_argument("out_dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "to-hf":
            out = export_hf(load_pretrained(args.checkpoint), args.out_dir)
        else:
            out = import_hf(load_pretrained(args.source), args.out_dir)
    except UserError as error:
        print(f"lightbert.convert: error: {error}", file=sys.stderr)
        return 2
    print(f"lightbert.convert: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
