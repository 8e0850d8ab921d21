"""Inference: lightbert's `predict` against `transformers.pipeline`, same model, same inputs, one process.

    python bench/predict_vs_pipeline.py --model bert_base --sentences 256 --threads 2

A GLUE-style classifier (random weights of the given size; a WordPiece vocabulary learnt from the demo corpus,
Python's documentation) is written once as a Hugging Face directory with `lightbert.interop.convert`'s export;
both sides
load that directory. The inputs are sentences of the demo corpus of mixed length (3 to 60 words), shuffled.

- lightbert: `lightbert.inference.predict.predict_records`, what `src/predict.py` runs between reading and writing
  the file:
  encoding, length-sorted batches of `--batch-size` padded per batch, the unpadded encoder, softmax and labels.
- transformers: `pipeline("text-classification", top_k=None)` on the list of texts, once with the pipeline's
  default batch size (1: no padding, one forward per sentence) and once with `--batch-size` (padded to each
  batch's longest, in the input order). Attention is transformers' default (sdpa).

Before timing, both give every sentence the same label and probabilities within 1e-4. The calls are interleaved
(each repeat runs every side once), medians over `--repeats`; the ratio is lightbert's examples/s over the faster
transformers configuration's. The last line is that ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
import yaml

from lightbert.checkpoints.reading import Pretrained
from lightbert.data.tokenizer import train_wordpiece
from lightbert.inference.predict import predict_records
from lightbert.interop.hf import export_hf, hf_head_config
from lightbert.model import BertConfig, BertForSequenceClassification
from lightbert.tasks.finetuned import FineTuned, load_finetuned
from lightbert.tasks.pretraining.corpus import DemoCorpus

REPO = Path(__file__).resolve().parents[1]
LABELS = ("negative", "positive")


def sentences(cache_dir: Path, count: int, seed: int) -> list[str]:
    documents = DemoCorpus().load(cache_dir)["sentences"]
    pool = [s for document in documents for s in document if 3 <= len(s.split()) <= 60]
    return random.Random(seed).sample(pool, count)


def write_classifier(directory: Path, model_name: str, texts: list[str], vocab_size: int) -> Path:
    """A random classifier of `model_name`'s sizes as a Hugging Face directory (lightbert's export)."""
    path = REPO / "conf" / "model" / f"{model_name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))
        sys.exit(f"predict_vs_pipeline.py: unknown --model {model_name}; valid: {valid}")
    tokenizer = train_wordpiece(texts, vocab_size=vocab_size)
    sizes = {**yaml.safe_load((path.parent / "_default.yaml").read_text()), **yaml.safe_load(path.read_text())}
    sizes.pop("defaults", None)  # Hydra's list over conf/model/_default.yaml, not a size
    config = BertConfig.from_dict({**sizes, "vocab_size": tokenizer.vocab_size})
    torch.manual_seed(0)
    model = BertForSequenceClassification(config, len(LABELS)).eval()
    # Sentences up to the model's positions, uncut: the pipeline cuts nothing either.
    settings = {"max_seq_length": config.max_position_embeddings}
    finetuned = FineTuned("sequence_classification", model, tokenizer, config, LABELS, "sst2", settings, "bench")
    pretrained = Pretrained(config.to_dict(), model.state_dict(), tokenizer, "bench")
    return export_hf(pretrained, directory, hf_head_config(finetuned), model.state_dict())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_base", help="a conf/model/ size")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "lightbert-bench-cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="both sides on this device")
    parser.add_argument(
        "--dtype", choices=["fp32", "bf16"], default=None, help="both sides; default fp32 CPU, bf16 GPU"
    )
    parser.add_argument(
        "--pipeline-batch-sizes", default=None, help="comma-separated; the best counts (default 1 and --batch-size; "
        "on a GPU also 128 and 256)",
    )  # fmt: skip
    args = parser.parse_args()
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    sizes = args.pipeline_batch_sizes or ("1,64,128,256" if args.device == "cuda" else f"1,{args.batch_size}")
    torch.set_num_threads(args.threads)
    texts = sentences(args.cache_dir, args.sentences, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        directory = write_classifier(Path(tmp) / "classifier", args.model, texts, args.vocab_size)
        finetuned = load_finetuned(str(directory))
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
        classify = transformers.pipeline(
            "text-classification", model=str(directory), device=args.device, top_k=None, dtype=dtype
        )
        records = [(number, {"text": text}) for number, text in enumerate(texts, start=1)]

        def ours() -> list[dict]:
            predicted = predict_records(
                finetuned, records, batch_size=args.batch_size, device=args.device, dtype=args.dtype
            )
            return predicted[0].predictions

        def theirs(batch_size: int):
            return lambda: classify(texts, batch_size=batch_size)

        sides = {"lightbert predict": ours}
        sides.update({f"pipeline, batch {size}": theirs(int(size)) for size in sizes.split(",")})
        check(ours(), theirs(args.batch_size)(), 1e-4 if args.dtype == "fp32" else 1e-3)
        for fn in sides.values():
            for _ in range(args.warmup):
                fn()
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, fn in sides.items():
                started = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - started)
    tokens = sum(len(finetuned.tokenizer.encode_batch([t])[0]) + 2 for t in texts)
    print(
        f"{args.model}, {len(texts)} sentences ({tokens} tokens, 3-60 words), {args.device} ({args.dtype}), "
        f"{args.threads} threads, median of {args.repeats}"
    )
    rates = {}
    for name, times in seconds.items():
        rates[name] = len(texts) / statistics.median(times)
        print(f"  {name:<24} {rates[name]:8.1f} examples/s  ({statistics.median(times) * 1000:.0f} ms)")
    best = max(rate for name, rate in rates.items() if name.startswith("pipeline"))
    print(f"predict speedup vs transformers.pipeline: {rates['lightbert predict'] / best:.2f}x")


def check(ours: list[dict], theirs: list[list[dict]], tolerance: float) -> None:
    """Same labels and probabilities within `tolerance`: the two sides do the same work."""
    for number, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        scores = {s["label"]: s["score"] for s in b}
        if a["label"] != max(scores, key=scores.get) or any(
            abs(a["probabilities"][label] - score) > tolerance for label, score in scores.items()
        ):
            sys.exit(f"predict_vs_pipeline.py: sentence {number} differs: lightbert {a}, transformers {b}")


if __name__ == "__main__":
    main()
