"""Fine-tune the same pre-trained checkpoint with lightbert and with transformers; compare dev accuracy and time.

    python bench/finetune_vs_transformers.py --init-from outputs/pretrain/runs/<run> [--epochs 3 --lr 1e-4]
    python bench/finetune_vs_transformers.py --init-from ... --device cuda   # trainer=gpu vs the loop in bf16

The task is real text without a download: sentences of the demo corpus (Python's documentation), label 1 for the
sentence as written and 0 for the same words shuffled (word-order acceptability, CoLA-like), in SST-2's schema.
lightbert runs `src/train.py task=glue/sst2` on those files; the reference exports the checkpoint with
`python -m lightbert.interop.convert to-hf` and fine-tunes `transformers.BertForSequenceClassification` with the same
hyperparameters (AdamW, eps 1e-6, weight decay 0.01 except biases and LayerNorm, 10% linear warmup, gradient
norm clipped at 1.0, dropout 0.1) in `bench/plain_transformers_finetune.py`. Both report dev accuracy after every
epoch. Both are whole commands in their own processes, timed from start to exit: Python's start and imports, data
preparation, training, validation; lightbert's also writes its checkpoints, metrics and predictions. The last line
is the ratio of the two wall times.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightbert.checkpoints.reading import load_pretrained
from lightbert.interop.hf import export_hf
from lightbert.tasks.pretraining.corpus import DemoCorpus

REPO = Path(__file__).resolve().parents[1]


def word_order_task(cache_dir: Path, out_dir: Path, num_train: int, num_dev: int, seed: int) -> dict[str, Path]:
    documents = DemoCorpus().load(cache_dir)["sentences"]
    sentences = [s for document in documents for s in document if 6 <= len(s.split()) <= 30]
    rng = random.Random(seed)
    rng.shuffle(sentences)
    rows = []
    for i, sentence in enumerate(sentences[: num_train + num_dev]):
        words = sentence.split()
        label = i % 2
        if label == 0:
            while words == sentence.split():
                rng.shuffle(words)
        rows.append({"sentence": " ".join(words), "label": label, "idx": i})
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"train": out_dir / "train.jsonl", "validation": out_dir / "dev.jsonl"}
    for split, part in (("train", rows[:num_train]), ("validation", rows[num_train:])):
        files[split].write_text("".join(json.dumps({**r, "idx": j}) + "\n" for j, r in enumerate(part)))
    return files


def run_lightbert(init_from: str, files: dict, args, out: Path) -> tuple[list[float], float]:
    started = time.time()
    subprocess.run(
        [
            sys.executable,
            str(REPO / "src" / "train.py"),
            "task=glue/sst2",
            f"init_from={init_from}",
            f"task.data_files.train={files['train']}",
            f"task.data_files.validation={files['validation']}",
            "trainer=gpu" if args.device == "cuda" else "trainer=cpu",  # gpu: bf16-mixed, fused AdamW
            "trainer.max_steps=-1",
            f"trainer.max_epochs={args.epochs}",
            f"task.batch_size={args.batch_size}",
            f"optim.lr={args.lr}",
            f"seed={args.seed}",
            "logger=csv",
            f"hydra.run.dir={out}",
        ],
        check=True,
        capture_output=True,
    )
    seconds = time.time() - started
    lines = (out / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    column = header.index("val/accuracy")
    accuracies = [float(r.split(",")[column]) for r in lines[1:] if r.split(",")[column]]
    return accuracies, seconds


def run_transformers(hf_dir: Path, files: dict, args) -> tuple[list[float], float]:
    """The plain loop as a user runs it: its own process, so both sides pay for starting Python and importing."""
    started = time.time()
    command = [sys.executable, str(Path(__file__).with_name("plain_transformers_finetune.py")), str(hf_dir)]
    command += [str(files["train"]), str(files["validation"]), str(args.epochs), str(args.batch_size), str(args.lr)]
    command += [str(args.seed), args.device]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1]), time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init-from", required=True, help="a lightbert run directory or .ckpt")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-dev", type=int, default=500)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: bf16 on both sides")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lightbert-bench-"))
    files = word_order_task(work / "cache", work / "data", args.num_train, args.num_dev, args.seed)
    hf_dir = export_hf(load_pretrained(args.init_from), work / "hf")
    ours, ours_seconds = run_lightbert(args.init_from, files, args, work / "lightbert-run")
    ref, ref_seconds = run_transformers(hf_dir, files, args)
    print(
        f"word-order task: {args.num_train} train / {args.num_dev} dev sentences; init_from={args.init_from}; "
        f"{args.device}{' (bf16)' if args.device == 'cuda' else ''}"
    )
    print("epoch  lightbert  transformers")
    for epoch, (a, b) in enumerate(zip(ours, ref, strict=False), 1):
        print(f"{epoch:5d}  {a:9.4f}  {b:12.4f}")
    print(f"whole run, wall time: lightbert {ours_seconds:.1f} s, plain transformers loop {ref_seconds:.1f} s")
    print(f"whole-run speedup vs plain transformers: {ref_seconds / ours_seconds:.2f}x")


if __name__ == "__main__":
    main()
