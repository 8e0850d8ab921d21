"""Pre-training data preparation at scale: CPU time, memory and disk per MB of text, against the tokenizer alone.

    python bench/scale_data.py --megabytes 50
    python bench/scale_data.py --megabytes 50 --baseline-src /tmp/before/src   # also another checkout, same corpus

Builds a synthetic corpus of the given size in the BERT format (a sentence per line, a blank line between
documents) and runs the project's own `PretrainDataModule` on it, as `src/train.py` would: the corpus read into
Arrow, a 30,522-token WordPiece vocabulary trained, the examples built and cached (`prepare_data`), then loaded
(`setup`) and batched by `train_dataloader` with masking. In the same run, the `tokenizers` library alone encodes
every line of the corpus with the trained vocabulary (`encode_batch_fast`, its fastest call): the alternative the
ratio is taken against.

The corpus: English prose from the Python documentation that ships with CPython (as `lightbert.tasks.pretraining.corpus`
extracts it), reassembled into "articles" (10-80 sentences, 80% of the text) and "books" (400-2,000 sentences), with
every number redrawn and about 3% of the words replaced by pseudo-words made of random syllables, so that the
vocabulary of distinct words keeps growing with the size as a real corpus's does. Nothing third-party.

Every figure is per CPU-second (`resource.getrusage` of the process and its children), so the load of a shared
machine does not move it; each side runs in a fresh process so its peak memory (`ru_maxrss`) is its own:
- preparation CPU-s per MB: training the tokenizer, tokenizing and making the pairs (reading the corpus included);
- peak memory: the preparing process, and the largest of its children (the tokenizer trainer, the map workers);
- cache bytes per text byte: the whole cache once the examples are prepared, by its parts (`examples/`,
  `tokenizers/`, and any copy of the corpus), and the examples cache entry alone; and the peak size of the cache
  directory's growth while the examples were written, sampled every 50 ms, against its final growth;
- loader examples per CPU-second of one worker: `train_dataloader` (masking included) in the main process;
- the ratio: the tokenizer alone's CPU-s over the preparation's (1.0 would mean preparing costs no more than
  tokenizing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SYLLABLES = "ka to ri mu sen lo pa qui dra vel nos ter ab zy or ent ion al ex un".split()


def build_corpus(path: Path, megabytes: float, seed: int = 0) -> Path:
    """A BERT-format corpus of about `megabytes` MB (see the module docstring); reused when already built."""
    if path.is_file():
        return path
    from lightbert.tasks.pretraining.corpus import python_documentation

    sentences = [s for document in python_documentation() for s in document]
    rng = random.Random(seed)
    number = re.compile(r"\d+")
    target = int(megabytes * 1e6)
    written = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        while written < target:
            book = rng.random() < 0.2 / 8  # books are ~8x longer than articles: 20% of the text
            length = rng.randint(400, 2000) if book else rng.randint(10, 80)
            start = rng.randrange(len(sentences))
            lines = []
            for k in range(length):
                sentence = sentences[(start + k * (1 if rng.random() < 0.7 else rng.randrange(1, 50))) % len(sentences)]
                sentence = number.sub(lambda _: str(rng.randrange(10_000)), sentence)
                words = sentence.split()
                for w in range(len(words)):
                    if rng.random() < 0.03:  # a pseudo-word: the vocabulary keeps growing with the corpus
                        words[w] = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 5)))
                lines.append(" ".join(words))
            block = "\n".join(lines) + "\n\n"
            f.write(block)
            written += len(block.encode("utf-8"))
    tmp.rename(path)
    return path


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # renamed or deleted while walking
                total += os.path.getsize(os.path.join(root, name))
    return total


def measure(corpus: Path, cache: Path, batches: int) -> dict:
    """One side's figures, in this (fresh) process."""
    import torch

    from lightbert.tasks.pretraining.corpus import TextCorpus
    from lightbert.tasks.pretraining.datamodule import PretrainDataModule

    torch.set_num_threads(1)
    dm = PretrainDataModule(TextCorpus([str(corpus)]), cache_dir=str(cache), batch_size=32, num_workers=0)
    examples_root = cache / "examples"
    peak_disk = [0]  # the whole cache directory: a map's intermediate files are written beside the corpus's
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak_disk[0] = max(peak_disk[0], directory_bytes(cache))
            time.sleep(0.05)

    started = read = cpu_seconds()  # the corpus is read as the tokenizer and the examples need it
    tokenizer = dm.tokenizer
    trained = cpu_seconds()
    before_examples = directory_bytes(cache)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    dm.prepare_data()
    stop.set()
    watcher.join()
    prepared = cpu_seconds()
    parent_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB (Linux reports KB)
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    cache_bytes = directory_bytes(examples_root)
    grown = directory_bytes(cache) - before_examples
    cache_parts = {part.name: directory_bytes(part) for part in sorted(cache.iterdir()) if part.is_dir()}
    dm.setup("fit")
    loader = dm.train_dataloader()
    started_loading = time.process_time()
    seen = 0
    for number, batch in enumerate(loader):
        seen += len(batch["input_ids"])
        if number + 1 >= batches:
            break
    loading = time.process_time() - started_loading

    lines = [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    before = cpu_seconds()
    for i in range(0, len(lines), 20_000):
        tokenizer.backend.encode_batch_fast(lines[i : i + 20_000], add_special_tokens=False)
    tokenizing = cpu_seconds() - before
    return {
        "read": read - started,
        "tokenizer": trained - read,
        "examples": prepared - trained,
        "prepare": prepared - started,
        "parent_peak_mb": parent_peak,
        "child_peak_mb": child_peak,
        "cache_bytes": cache_bytes,
        "cache_total_bytes": sum(cache_parts.values()),
        "cache_parts": cache_parts,
        "peak_growth_bytes": max(peak_disk[0] - before_examples, grown),
        "final_growth_bytes": grown,
        "train_examples": len(dm.datasets["train"]),
        "validation_examples": len(dm.datasets["validation"]),
        "loader_examples_per_cpu_s": seen / loading,
        "tokenizer_alone": tokenizing,
        "vocab": tokenizer.vocab_size,
    }


def run_side(src: Path, corpus: Path, batches: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "TOKENIZERS_PARALLELISM": "true"}
    with tempfile.TemporaryDirectory(dir=corpus.parent) as cache:
        result = subprocess.run(
            [sys.executable, __file__, "--measure", str(corpus), "--cache", cache, "--batches", str(batches)],
            env=env,
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise SystemExit(f"the measurement with {src} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(name: str, figures: dict, megabytes: float) -> None:
    f = figures
    print(
        f"{name}: {f['prepare'] / megabytes:.2f} CPU-s/MB to cached examples (tokenizer {f['tokenizer']:.1f} s, "
        f"examples {f['examples']:.1f} s, each reading the corpus as it needs); tokenizer alone "
        f"{f['tokenizer_alone'] / megabytes:.3f} CPU-s/MB: {f['tokenizer_alone'] / f['prepare']:.2f}x"
    )
    print(
        f"{name}: the whole cache {f['cache_total_bytes'] / (megabytes * 1e6):.2f} bytes per text byte ("
        + ", ".join(f"{part}/ {size / (megabytes * 1e6):.2f}" for part, size in f["cache_parts"].items())
        + ")"
    )
    print(
        f"{name}: peak memory {f['parent_peak_mb']:.0f} MB (largest child {f['child_peak_mb']:.0f} MB); examples "
        f"{f['cache_bytes'] / (megabytes * 1e6):.2f} bytes per text byte, the cache directory's peak growth while it "
        f"was written {f['peak_growth_bytes'] / max(1, f['final_growth_bytes']):.2f}x its final growth; "
        f"{f['train_examples']} training and "
        f"{f['validation_examples']} validation examples; loader {f['loader_examples_per_cpu_s']:.0f} examples per "
        f"CPU-second of one worker; vocabulary {f['vocab']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--corpus-dir", default=str(Path(tempfile.gettempdir()) / "lightbert-scale"))
    parser.add_argument("--baseline-src", help="another checkout's src/ to measure on the same corpus")
    parser.add_argument("--batches", type=int, default=300, help="loader batches of 32 to time")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure), Path(args.cache), args.batches)))
        return
    corpus_dir = Path(args.corpus_dir)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    started = time.process_time()
    corpus = build_corpus(corpus_dir / f"corpus-{args.megabytes:g}MB.txt", args.megabytes)
    megabytes = corpus.stat().st_size / 1e6
    print(f"corpus {corpus}: {megabytes:.1f} MB (built in {time.process_time() - started:.0f} CPU-s, or reused)")
    ours = run_side(Path(__file__).resolve().parents[1] / "src", corpus, args.batches)
    report("lightbert", ours, megabytes)
    if args.baseline_src:
        theirs = run_side(Path(args.baseline_src), corpus, args.batches)
        report("baseline", theirs, megabytes)
        print(f"preparation speedup over the baseline: {theirs['prepare'] / ours['prepare']:.2f}x")
    hours = ours["prepare"] / megabytes * 20_000 / 3600
    print(
        f"extrapolated to 20 GB: {hours:.1f} core-hours of preparation ({hours / 16:.1f} h on 16 cores), a cache of "
        f"{ours['cache_bytes'] / megabytes * 20_000 / 1e9:.0f} GB"
    )
    print(f"data preparation vs tokenizer alone: {ours['tokenizer_alone'] / ours['prepare']:.2f}x")


if __name__ == "__main__":
    main()
