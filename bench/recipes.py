"""The paper's recipe and the modern one side by side on a CPU: each quick start for the same number of steps on the
demo corpus, then both models scored on the same held-out masks.

    python bench/recipes.py --steps 1000 --out outputs/recipes --report bench/results/recipes.md

1. `src/train.py experiment=quick_start` (bert_tiny, MLM 15% + NSP on sentence pairs, the paper's linear schedule)
   and `src/train.py experiment=modern_quick_start` (modernbert_tiny, MLM 30% alone on contiguous chunks of documents,
   packed, warmup-stable-decay, the context doubled for the last 10%), each `--steps` steps of 8 x 64 tokens at lr
   1e-3, as a user runs them.
2. Both runs train the same WordPiece vocabulary on the same corpus with the same settings (checked here), and hold
   out the same documents (the same seed). Those documents are cut both ways: into the paper run's held-out
   sentence pairs (the paper's inputs) and into the modern run's held-out chunks (64 tokens of one document). Each
   is masked once per rate (15%, BERT's, and 30%, ModernBERT's; the collator's 80/10/10 with a fixed seed) and both
   models predict the same masked tokens: the masked-token accuracy of each model at each rate, on identical inputs,
   of either kind (each model's own kind and the other's).

3. Each model fine-tuned on the same small task (`--finetune-examples`, 0 for none): `task=glue/sst2` on
   `bench/finetune_vs_transformers.py`'s word-order task (sentences of the demo corpus as written, label 1, or with
   their words shuffled, label 0), 2 epochs at lr 1e-4, sequences of 64: the dev accuracy of each.

The report (`--report`) holds the table, the commands and their wall times.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"paper": "quick_start", "modern": "modern_quick_start"}
RATES = (0.15, 0.30)
EXAMPLES = {"paper": "held-out pairs", "modern": "held-out chunks"}


def train(experiment: str, steps: int, run_dir: Path) -> float:
    """One quick start as a user runs it (its output in <run_dir>.log); its wall time."""
    command = [sys.executable, "src/train.py", f"experiment={experiment}", "logger=csv", f"trainer.max_steps={steps}",
               f"task.cpu_val_check_interval={max(1, steps // 4)}", f"hydra.run.dir={run_dir}"]  # fmt: skip
    started = time.time()
    with run_dir.with_suffix(".log").open("w") as out:
        result = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"recipes.py: experiment={experiment} failed; see {run_dir.with_suffix('.log')}")
    return time.time() - started


def held_out_batches(name: str, run_dir: Path, tokenizer, rate: float) -> list[dict]:
    """Recipe `name`'s held-out examples (its corpus, seed, split and examples: the paper's sentence pairs, the
    modern recipe's chunks), masked at `rate`, 64 tokens, unpacked, masked language modelling alone."""
    from lightbert.run.building import datamodule
    from lightbert.run.config_checks import checked_config
    from lightbert.run.configs import compose_config
    from lightbert.run.settings import RunSettings

    cfg = compose_config([f"experiment={RECIPES[name]}", "task.datamodule.num_workers=0"], run_dir / "eval")
    settings = RunSettings.from_config(checked_config(cfg))
    changes = {"masked_lm_prob": rate, "objective": "mlm", "packing": False, "batch_size": 32, "validation_share": None}
    data = datamodule(settings, {"tokenizer": tokenizer}, changes)
    data.prepare_data()
    data.setup("validate")
    return list(data.val_dataloader())


def accuracy(run_dir: Path, batches: list[dict]) -> float:
    """Masked-token accuracy of the run's last checkpoint over `batches`."""
    import torch

    from lightbert.data.encoding import IGNORE_INDEX
    from lightbert.tasks.pretraining.module import PreTrainingModule

    module = PreTrainingModule.load_from_checkpoint(run_dir / "checkpoints" / "last.ckpt", weights_only=True).eval()
    right = total = 0
    with torch.no_grad():
        for batch in batches:
            logits, _ = module.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            labelled = batch["labels"] != IGNORE_INDEX
            right += int((logits.argmax(-1)[labelled] == batch["labels"][labelled]).sum())
            total += int(labelled.sum())
    return right / total


def finetune(run_dir: Path, files: dict[str, Path], out: Path) -> float:
    """`task=glue/sst2` from the run on `files`; the dev accuracy."""
    import json

    data = [f"task.data_files.{split}={path}" for split, path in files.items()]
    command = [sys.executable, "src/train.py", "task=glue/sst2", f"init_from={run_dir}", "trainer=cpu", "logger=csv",
               "trainer.max_steps=-1", "trainer.max_epochs=2", "optim.lr=1e-4", "task.max_seq_length=64", *data,
               f"hydra.run.dir={out}"]  # fmt: skip
    with out.with_suffix(".log").open("w") as log:
        result = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"recipes.py: fine-tuning from {run_dir} failed; see {out.with_suffix('.log')}")
    return json.loads((out / "results.json").read_text())["metrics"]["val/accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="pre-training steps of each recipe (the quick start's)")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "recipes")
    parser.add_argument("--report", type=Path, help="a Markdown file for the table")
    parser.add_argument(
        "--reuse",
        nargs="*",
        choices=list(RECIPES),
        metavar="RECIPE",
        help="score these recipes' runs already in --out instead of training them (none named: all)",
    )
    parser.add_argument("--finetune-examples", type=int, default=2000, help="word-order training examples (0: none)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    walls = {}
    reused = set(RECIPES) if args.reuse == [] else set(args.reuse or ())  # a bare --reuse: every recipe
    for name, experiment in RECIPES.items():
        if name not in reused:
            walls[name] = train(experiment, args.steps, args.out / name)

    from lightbert.data.tokenizer import load_tokenizer

    tokenizers = {name: load_tokenizer(args.out / name / "tokenizer.json") for name in RECIPES}
    if tokenizers["paper"].backend.get_vocab() != tokenizers["modern"].backend.get_vocab():
        sys.exit("recipes.py: the two runs trained different vocabularies; the masks would not be the same tokens")
    scores, counted = {}, {}
    for kind in RECIPES:  # the held-out documents as the paper's pairs, then as the modern recipe's chunks
        for rate in RATES:
            batches = held_out_batches(kind, args.out / kind, tokenizers[kind], rate)
            masked = sum(int((b["labels"] != -100).sum()) for b in batches)
            counted[kind, rate] = (masked, sum(len(b["input_ids"]) for b in batches))
            for name in RECIPES:
                scores[name, kind, rate] = accuracy(args.out / name, batches)
            print(f"{EXAMPLES[kind]} masked at {rate:.0%}: {masked} tokens of {counted[kind, rate][1]} examples")
    tuned = {}
    if args.finetune_examples:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from finetune_vs_transformers import word_order_task

        examples = args.finetune_examples
        files = word_order_task(args.out / "cache", args.out / "word_order", examples, examples // 4, seed=0)
        for name in RECIPES:
            tuned[name] = finetune(args.out / name, files, args.out / f"{name}_word_order")
    columns = [f"{EXAMPLES[kind]}, {rate:.0%} masked" for kind in RECIPES for rate in RATES]
    lines = [
        f"| recipe | pre-training | {' | '.join(columns)} | word order (dev accuracy) | "
        f"wall time ({args.steps} steps) |",
        "| --- | --- |" + " --- |" * (len(columns) + 2),
    ]
    own = {"paper": "bert_tiny, MLM 15% + NSP on pairs", "modern": "modernbert_tiny, MLM 30% alone on chunks, packed"}
    for name in RECIPES:
        wall = f"{walls[name] / 60:.1f} min" if name in walls else "(reused)"
        word_order = f"{tuned[name]:.4f}" if name in tuned else "-"
        accuracies = " | ".join(f"{scores[name, kind, rate]:.4f}" for kind in RECIPES for rate in RATES)
        lines.append(f"| {name} | {own[name]} | {accuracies} | {word_order} | {wall} |")
    held_out = "; ".join(
        f"{EXAMPLES[kind]} at {rate:.0%}: {counted[kind, rate][0]:,} masked tokens in "
        f"{counted[kind, rate][1]:,} examples"
        for kind in RECIPES
        for rate in RATES
    )
    table = "\n".join(lines) + f"\n\nThe held-out examples: {held_out}."
    print(table)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        commands = "\n".join(
            f"python src/train.py experiment={e} trainer.max_steps={args.steps}" for e in RECIPES.values()
        )
        args.report.write_text(
            f"# The two recipes side by side\n\n`python bench/recipes.py --steps {args.steps}`: held-out masked-token "
            f"accuracy of each model on the same masks.\n\n{table}\n\n```bash\n{commands}\n```\n"
        )


if __name__ == "__main__":
    main()
