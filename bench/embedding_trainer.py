"""Sentence embeddings: lightbert's `task=embedding` against sentence-transformers' `SentenceTransformerTrainer`.

    python bench/embedding_trainer.py                      # 3 seeds x 2 systems, about 2 minutes on 2 idle CPU cores
    python bench/embedding_trainer.py --quick              # about a minute: 320 pairs, 10 steps, 1 seed
    python bench/embedding_trainer.py --device cuda        # one GPU: a BERT-Base-sized model, 1,920 pairs, 120 steps

The same job on both sides: contrastive fine-tuning with InfoNCE over in-batch negatives (sentence-transformers'
`MultipleNegativesRankingLoss`: scale 20, cosine similarity), mean pooling, from one Hugging Face BERT directory
(random weights of BERT-Tiny's size, L2/H128/A2, written once with a WordPiece vocabulary learnt from the training
texts), on the same pairs, with the same batch size, number of steps, seed and optimiser: AdamW (betas 0.9/0.999, eps
1e-6, weight decay 0.01 on the matrices only, torch's fused kernel), linear warmup over 10% of the steps then linear
decay to 0, gradient norm clipped at 1.0 (lightbert's conf/optim/adamw.yaml and conf/task/_finetune.yaml; the ST
trainer's TrainingArguments set to match). Training batches hold no text twice on both sides (lightbert's
NoDuplicatesSampler, ST's `BatchSamplers.NO_DUPLICATES`); the two shuffles differ, so the runs are not bit for bit
the same, and the seeds say how far apart runs of one system land.

Data: real English text with no download, the docstrings of CPython's standard library (as the demo corpus reads
them, `lightbert.tasks.pretraining.corpus`): anchor = a function's, class's or module's docstring summary line,
positive = the docstring's next paragraph. Every text is kept once (a pair whose anchor or positive was seen is
dropped), and the split is by source file, so no held-out file's docstrings are trained on. Licence: the Python
Software Foundation License Version 2 (CPython's source and documentation).

Scores: both models are scored the same way, by `lightbert.tasks.embedding.metrics` (every held-out anchor against
every held-out positive, cosine: recall@1, recall@10, MRR@10, NDCG@10) on `SentenceTransformer.encode` of the trained
model: ST's as it trained it, lightbert's exported with `lightbert.interop.convert.to_hf` (modules.json and the
pooling written beside it). lightbert's own logged val/* numbers (results.json) are checked against that.

Timing: each run is a fresh `python` process (this script, `--worker`), both sides with the same environment and
torch's thread count (`--threads`, OMP_NUM_THREADS too), run alternately (lightbert first for even seeds, ST first for
odd ones). `job` is the whole job after the imports, as a user's script runs it: lightbert's `train(cfg)` (tokenizing
and caching the pairs, training, validation at the end of each epoch, checkpoints, results.json); ST's model built
from the directory, `trainer.train()` (it tokenizes every batch as it comes), the held-out pairs encoded and scored,
and the model saved. `train loop` is the training alone: Lightning's fit loop from its first to its last training
batch (a callback), ST's `train_runtime`. `one step` is a training step from the batch in hand to the optimizer's
step (forward, backward, clipping, AdamW, schedule; ST's tokenizing is in its collator, outside it), the median of a
run's steps, and of the runs the fastest. `job CPU` is the worker's CPU time over the job (all its threads), the
measure least moved by other processes on a shared machine. Medians over the seeds; the ratio is ST's time over
lightbert's (above 1: lightbert faster).

`--device cuda` runs both sides on the GPU as each one's user gets it, so the precision differs from the CPU case
(fp32 on both sides there): lightbert runs `trainer=gpu` with its GPU defaults, bf16-mixed autocast (fp32 weights and
AdamW state), fp32 matmuls on TF32 (speed.matmul_precision=high) and the step compiled by torch.compile
(speed.compile=null compiles a training run on CUDA; each run compiles afresh, its cache in the run's own
paths.cache_dir, and that compiling counts in its job and its training loop); ST's TrainingArguments take bf16=True
(the HF Trainer's bf16 autocast, fp32 weights), eager, without TF32. Both trained models are scored by
`SentenceTransformer.encode` on the GPU in fp32, so lightbert's logged val/* (computed under bf16 autocast) differ from
the recomputed scores by bf16's rounding, not by 1e-5 as on a CPU. The step timers synchronize the GPU at a step's
start and end. The defaults grow with the device (see `main`): BERT-Base's size, more pairs, more steps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METRICS = ("recall_at_1", "recall_at_10", "mrr_at_10", "ndcg_at_10")
SOURCE = "CPython standard-library docstrings (summary line -> next paragraph); Python Software Foundation License v2"

# BERT-Tiny's size (L2/H128/A2; Turc et al. 2019, bert_tiny here): what 2 CPU cores train 6 times in about 2 minutes.
# --size mini: bert_mini's (L4/H256/A4), about 4x the work a step. --size base: BERT-Base's (L12/H768/A12), the size
# people fine-tune sentence embeddings from, --device cuda's default.
SIZES = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512},
    "mini": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}


# -- data ------------------------------------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def docstring_pairs() -> list[tuple[str, str, str]]:
    """(source file, anchor, positive) from every docstring of the standard library with a summary line of 4+ words
    followed by a prose paragraph of 8+ words (no doctest, no table)."""
    from lightbert.tasks.pretraining.corpus import stdlib_docstrings

    pairs = []
    for source, docstrings in stdlib_docstrings():
        for docstring in docstrings:
            paragraphs = [p for p in docstring.split("\n\n") if p.strip()]
            if len(paragraphs) < 2:
                continue
            anchor, positive = _one_line(paragraphs[0]), _one_line(paragraphs[1])
            if len(anchor.split()) < 4 or len(positive.split()) < 8:
                continue
            if any(mark in paragraphs[1] for mark in (">>>", "+--", "|")):
                continue
            pairs.append((source, anchor, positive))
    return pairs


def prepare_data(out: Path, num_train: int, num_dev: int, seed: int = 0) -> dict[str, Path]:
    """train.jsonl and dev.jsonl (anchor, positive) in `out`: every text distinct across both splits; the held-out
    pairs from source files of their own. Returns the two paths and the number of pairs in each."""
    seen: set[str] = set()
    by_file: dict[str, list[dict]] = {}
    for source, anchor, positive in docstring_pairs():
        if anchor in seen or positive in seen or anchor == positive:
            continue
        seen.update((anchor, positive))
        by_file.setdefault(source, []).append({"anchor": anchor, "positive": positive})
    files = sorted(by_file)
    random.Random(seed).shuffle(files)
    train, dev = [], []
    for source in files:  # held-out files first until num_dev pairs, then training files
        (dev if len(dev) < num_dev else train).extend(by_file[source])
    if len(train) < num_train:
        raise SystemExit(f"only {len(train)} training pairs in the docstrings, {num_train} asked for")
    random.Random(seed).shuffle(train)
    train = train[:num_train]
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.jsonl", "validation": out / "dev.jsonl"}
    for split, rows in (("train", train), ("validation", dev)):
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return paths


def write_model(directory: Path, train_file: Path, size: str, vocab_size: int, seed: int = 0) -> Path:
    """A random BERT of `size` as transformers saves it, with a WordPiece vocabulary learnt from the training texts
    and its tokenizer files (lowercased, as lightbert's vocab.txt reading)."""
    import torch
    import transformers

    from lightbert.data.tokenizer import train_wordpiece

    rows = [json.loads(line) for line in train_file.read_text(encoding="utf-8").splitlines()]
    texts = [r[c] for r in rows for c in ("anchor", "positive")]
    tokenizer = train_wordpiece(texts, vocab_size=vocab_size)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_vocab_txt(directory / "vocab.txt")
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, max_position_embeddings=512, **SIZES[size])
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(directory)
    transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=True).save_pretrained(directory)
    return directory


def check_same_tokens(model_dir: Path, texts: list[str], max_seq_length: int) -> None:
    """Both sides cut and number the texts the same: lightbert's `encode_texts` against the directory's tokenizer."""
    import transformers

    from lightbert.data.tokenizer import load_tokenizer
    from lightbert.tasks.embedding.data import encode_texts

    ours, _ = encode_texts(texts, load_tokenizer(model_dir / "vocab.txt"), max_seq_length)
    theirs = transformers.AutoTokenizer.from_pretrained(model_dir)(texts, truncation=True, max_length=max_seq_length)
    if ours != theirs["input_ids"]:
        bad = next(i for i, (a, b) in enumerate(zip(ours, theirs["input_ids"], strict=True)) if a != b)
        raise SystemExit(f"the two tokenizers differ on {texts[bad]!r}: {ours[bad]} vs {theirs['input_ids'][bad]}")


# -- scoring ---------------------------------------------------------------------------------------------------------


def st_scores(model, dev_file: Path, batch_size: int = 64) -> dict[str, float]:
    """The retrieval scores of a SentenceTransformer on the held-out pairs, by lightbert's metrics: every anchor
    against every distinct positive (all are distinct here), cosine."""
    import torch

    from lightbert.tasks.embedding.metrics import positive_ranks, retrieval_scores

    rows = [json.loads(line) for line in dev_file.read_text(encoding="utf-8").splitlines()]
    anchors = model.encode([r["anchor"] for r in rows], batch_size=batch_size, convert_to_tensor=True)
    positives = model.encode([r["positive"] for r in rows], batch_size=batch_size, convert_to_tensor=True)
    return retrieval_scores(positive_ranks(anchors.cpu(), positives.cpu(), torch.arange(len(rows))))


# -- the two workers -------------------------------------------------------------------------------------------------


def run_lightbert(args) -> dict:
    import lightning as L

    from lightbert import train
    from lightbert.run.configs import compose_config

    sync = gpu_sync(args.device)

    class LoopTimer(L.Callback):  # first to last training batch, as ST's train_runtime counts its loop; each step
        start = end = None

        def __init__(self):
            self.steps: list[float] = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            sync()
            self.step_start = time.perf_counter()
            if self.start is None:
                self.start = self.step_start

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            sync()
            self.end = time.perf_counter()
            self.steps.append(self.end - self.step_start)

    timer = LoopTimer()
    original_init = L.Trainer.__init__

    def with_timer(self, *a, callbacks=None, **kw):  # the bench's callback added to the run's own
        original_init(self, *a, callbacks=[*(callbacks or []), timer], **kw)

    run_dir = Path(args.run_dir)
    overrides = [
        "task=embedding",
        f"init_from={args.model_dir}",
        f"task.data_files.train={args.data_dir}/train.jsonl",
        f"task.data_files.validation={args.data_dir}/dev.jsonl",
        "trainer=cpu" if args.device == "cpu" else "trainer=gpu",  # with the GPU's defaults: bf16-mixed, compiled
        f"trainer.max_steps={args.steps}",
        f"trainer.max_epochs={args.epochs}",
        f"task.batch_size={args.batch_size}",
        f"task.max_seq_length={args.max_seq_length}",
        "task.pooling=mean",
        f"optim.lr={args.lr}",
        f"seed={args.seed}",
        "logger=csv",
        f"paths.cache_dir={run_dir / 'cache'}",  # each run tokenizes afresh, as ST does
        *args.lightbert_overrides,
    ]
    cfg = compose_config(overrides, run_dir, REPO / "conf")
    L.Trainer.__init__ = with_timer
    started = time.perf_counter()
    try:
        results = train(cfg)
    finally:
        L.Trainer.__init__ = original_init
    job = time.perf_counter() - started
    logged = {name: float(results["metrics"][f"val/{name}"]) for name in METRICS}
    scores, exported = lightbert_scores(results, run_dir, Path(args.data_dir) / "dev.jsonl", args.device)
    return {
        "job_s": job,
        "train_loop_s": timer.end - timer.start,
        "step_ms": 1000 * statistics.median(timer.steps),
        "steps": int(results["global_step"]),
        "scores": scores,
        "logged": logged,
        "exported_to": str(exported),
    }


def lightbert_scores(results: dict, run_dir: Path, dev_file: Path, device: str = "cpu") -> tuple[dict, Path]:
    """The last checkpoint (the one its val/* numbers were logged for), exported as a sentence-transformers directory
    and scored as ST's model is."""
    from sentence_transformers import SentenceTransformer

    from lightbert.interop.convert import to_hf

    exported = to_hf(results["last_checkpoint"], str(run_dir / "exported"))
    return st_scores(SentenceTransformer(str(exported), device=device), dev_file), exported


def gpu_sync(device: str):
    """What a step timer calls at a step's start and end: on CUDA, waiting for the GPU (its kernels run behind the
    host); on a CPU, nothing."""
    if device == "cpu":
        return lambda: None
    import torch

    return torch.cuda.synchronize


def run_sentence_transformers(args) -> dict:
    import datasets
    import transformers
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
        models,
    )
    from sentence_transformers.training_args import BatchSamplers

    run_dir = Path(args.run_dir)
    started = time.perf_counter()
    word = models.Transformer(args.model_dir, max_seq_length=args.max_seq_length)
    pooling = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    model = SentenceTransformer(modules=[word, pooling], device=args.device)
    train_data = datasets.load_dataset("json", data_files=f"{args.data_dir}/train.jsonl", split="train",
                                       cache_dir=str(run_dir / "hf-cache"))  # fmt: skip
    loss = losses.MultipleNegativesRankingLoss(model, scale=20.0)  # cosine similarity, its default
    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(run_dir / "st"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=round(0.1 * args.steps),  # lightbert's round(warmup_ratio x total steps)
        weight_decay=0.01,  # HF's trainer, like lightbert, spares biases and LayerNorm weights
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",  # lightbert's optim.fused=null: torch's fused AdamW (CPU and CUDA)
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        dataloader_drop_last=True,
        seed=args.seed,
        data_seed=args.seed,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=max(1, args.steps // 4),
        report_to="none",
        disable_tqdm=True,
        # on a GPU, bf16 autocast as lightbert's trainer=gpu (the HF Trainer's bf16=True: fp32 weights)
        **({"use_cpu": True} if args.device == "cpu" else {"use_cpu": False, "bf16": True}),
    )
    steps: list[float] = []
    sync = gpu_sync(args.device)

    class StepTimer(transformers.TrainerCallback):  # from the batch in hand to the optimizer's step, as lightbert's
        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            steps.append(time.perf_counter() - self.start)

    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=train_data, loss=loss,
                                         callbacks=[StepTimer()])  # fmt: skip
    output = trainer.train()
    scores = st_scores(model, Path(args.data_dir) / "dev.jsonl")
    model.save(str(run_dir / "model"))
    job = time.perf_counter() - started
    return {
        "job_s": job,
        "train_loop_s": float(output.metrics["train_runtime"]),
        "step_ms": 1000 * statistics.median(steps),
        "steps": int(trainer.state.global_step),
        "scores": scores,
    }


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cpu = time.process_time()
    result = run_lightbert(args) if args.worker == "lightbert" else run_sentence_transformers(args)
    result.update(system=args.worker, seed=args.seed, threads=torch.get_num_threads(), imports_s=started - T0,
                  job_cpu_s=time.process_time() - cpu)  # fmt: skip
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    print("RESULT " + json.dumps(result), flush=True)


# -- the comparison --------------------------------------------------------------------------------------------------


def launch(system: str, seed: int, args, paths: dict, run_dir: Path) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--seed", str(seed),
               "--model-dir", str(paths["model"]), "--data-dir", str(paths["data"]), "--run-dir", str(run_dir),
               "--steps", str(args.steps), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
               "--max-seq-length", str(args.max_seq_length), "--lr", str(args.lr),
               "--threads", str(args.threads), "--device", args.device]  # fmt: skip
    for override in args.lightbert_overrides:
        command += ["--lightbert", override]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONWARNINGS": "ignore"}  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{system} seed {seed} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def spread(runs: list[dict], metric: str) -> str:
    values = [r["scores"][metric] for r in runs]
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def report(summary: dict) -> str:
    runs = summary["runs"]
    lb = [r for r in runs if r["system"] == "lightbert"]
    st = [r for r in runs if r["system"] == "sentence-transformers"]
    n = len(lb)
    lines = [
        "| | lightbert `task=embedding` | sentence-transformers `SentenceTransformerTrainer` | ST / lightbert |",
        "|---|---|---|---|",
    ]
    timings = (("job_s", "whole job, wall s (median)"), ("train_loop_s", "training loop, wall s (median)"),
               ("job_cpu_s", "whole job, CPU s (median)"), ("imports_s", "imports, wall s (median)"))  # fmt: skip
    for key, label in timings:
        a, b = median_of(lb, key), median_of(st, key)
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | **{b / a:.2f}x** |" if key == "job_s"
                     else f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")  # fmt: skip
    if all("step_ms" in r for r in runs):  # each run's median step; the least loaded run's is the fairest on a busy box
        a, b = min(r["step_ms"] for r in lb), min(r["step_ms"] for r in st)
        lines.append(f"| one step, ms (median of a run's steps; its fastest run) | {a:.0f} | {b:.0f} | {b / a:.2f}x |")
    for name in METRICS:
        a, b = spread(lb, name), spread(st, name)
        lines.append(f"| {name} (mean ± sd of {n} seeds) | {a} | {b} | |")
    diff = max(abs(r["scores"][m] - r["logged"][m]) for r in lb for m in METRICS)
    what = "lightbert's logged val/* minus the same scores on ST's encode of its export (max abs)"
    lines.append(f"| {what} | {diff:.1e} | | |")
    return "\n".join(lines)


def compare(args) -> dict:
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="lightbert-embedding-bench-"))
    data = work / "data"
    files = prepare_data(data, args.num_train, args.num_dev)
    model_dir = write_model(work / "bert", files["train"], args.size, args.vocab_size)
    dev_rows = [json.loads(line) for line in files["validation"].read_text().splitlines()]
    check_same_tokens(model_dir, [r[c] for r in dev_rows[:200] for c in ("anchor", "positive")], args.max_seq_length)
    args.steps = args.epochs * (args.num_train // args.batch_size)  # every text distinct: every batch fills
    paths = {"data": data, "model": model_dir}
    print(f"data: {args.num_train} training pairs, {len(dev_rows)} held-out pairs ({SOURCE}); "
          f"model: {args.size} {SIZES[args.size]}; {args.steps} steps of {args.batch_size} pairs, lr {args.lr}; "
          f"{args.threads} torch threads", flush=True)  # fmt: skip
    runs, load_before = [], os.getloadavg()
    for i, seed in enumerate(args.seeds):
        order = ["lightbert", "sentence-transformers"] if i % 2 == 0 else ["sentence-transformers", "lightbert"]
        for system in order:
            result = launch(system, seed, args, paths, work / f"{system}-{seed}")
            runs.append(result)
            print(f"{system:22s} seed {seed}: job {result['job_s']:.1f} s, loop {result['train_loop_s']:.1f} s, "
                  f"steps {result['steps']}, " + ", ".join(f"{m} {result['scores'][m]:.3f}" for m in METRICS),
                  flush=True)  # fmt: skip
            if result["steps"] != args.steps:
                raise SystemExit(f"{system} ran {result['steps']} steps, not {args.steps}")
    summary = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}"
        + (f", {runs[0]['gpu']}" if "gpu" in runs[0] else ""),
        "device": args.device,
        "command": "python bench/embedding_trainer.py " + " ".join(sys.argv[1:]),
        "data": {"source": SOURCE, "train_pairs": args.num_train, "heldout_pairs": len(dev_rows)},
        "model": {"size": args.size, **SIZES[args.size]},
        "settings": {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "warmup_ratio": 0.1,
            "max_seq_length": args.max_seq_length,
            "threads": args.threads,
            "seeds": args.seeds,
        },
        "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},  # other processes' share
        "runs": runs,
    }
    lb = [r for r in runs if r["system"] == "lightbert"]
    st = [r for r in runs if r["system"] == "sentence-transformers"]
    summary["ratio_job"] = median_of(st, "job_s") / median_of(lb, "job_s")
    summary["ratio_train_loop"] = median_of(st, "train_loop_s") / median_of(lb, "train_loop_s")
    summary["logged_vs_recomputed_max_abs"] = max(abs(r["scores"][m] - r["logged"][m]) for r in lb for m in METRICS)
    summary["table"] = report(summary)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute: 320 training pairs, one epoch, one seed")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both sides train (cuda: bf16 autocast on both, lightbert compiled)")  # fmt: skip
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="default tiny (cuda: base)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0)")
    parser.add_argument("--num-train", type=int, default=None,
                        help="training pairs (default 1280, cuda 1920; --quick 320)")  # fmt: skip
    parser.add_argument("--num-dev", type=int, default=None, help="held-out pairs, at least (default 300; --quick 200)")
    parser.add_argument("--epochs", type=int, default=None, help="default 1 (cuda 4; --quick 1)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 32 (cuda 64)")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=None,
                        help="peak learning rate (default 3e-4, a small model from scratch; cuda 1e-4)")  # fmt: skip
    parser.add_argument("--vocab-size", type=int, default=None, help="WordPiece entries (default 8000)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--lightbert", dest="lightbert_overrides", action="append", default=[], metavar="OVERRIDE",
                        help="an extra override for lightbert's run, e.g. --lightbert speed.unpad=false")  # fmt: skip
    parser.add_argument("--work-dir", default=None, help="where the data, model and runs go (default: a temp dir)")
    parser.add_argument("--out", default=None, help="write the JSON summary here and the table beside it (.md)")
    # the worker's own
    parser.add_argument("--worker", choices=["lightbert", "sentence-transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    quick, gpu = args.quick, args.device == "cuda"
    args.seeds = args.seeds or ([0] if quick else [0, 1, 2])
    # On a GPU: BERT-Base's size, what sentence embeddings are fine-tuned from (a tiny or mini step is a few
    # launch-bound milliseconds there: it would time the host, not the training); 64 pairs a batch, a busier GPU and
    # more in-batch negatives, as MultipleNegativesRankingLoss is used; 1,920 pairs, nearly all the docstrings leave
    # beside the held-out files, for 4 epochs: 120 steps, enough for a steady median step. The whole job and the loop
    # still hold lightbert's compiling (never measured here; tens of seconds by estimate), which so short a run does
    # not pay back, as a user's short first run does not. lr 1e-4: BERT's own peak for its base size.
    args.size = args.size or ("base" if gpu else "tiny")
    args.num_train = args.num_train or (320 if quick else 1920 if gpu else 1280)
    args.num_dev = args.num_dev or (200 if quick else 300)
    args.epochs = args.epochs or (4 if gpu and not quick else 1)
    args.batch_size = args.batch_size or (64 if gpu else 32)
    args.lr = args.lr or (1e-4 if gpu else 3e-4)
    args.vocab_size = args.vocab_size or 8000
    summary = compare(args)
    print(summary["table"])
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2) + "\n")
        out.with_suffix(".md").write_text(summary["table"] + "\n")
        print(f"written: {out} and {out.with_suffix('.md')}")
    print(f"job time ratio sentence-transformers / lightbert: {summary['ratio_job']:.2f}x; "
          f"training loop: {summary['ratio_train_loop']:.2f}x")  # fmt: skip


T0 = time.perf_counter()

if __name__ == "__main__":
    main()
