"""A small run of the paper's Table 5 (pre-training objectives) that a 2-core CPU machine finishes within an hour,
on the demo corpus and a task generated from it (word order). Its report of 2026-11-24 is
bench/results/ablation_word_order.md; the study on real text and human-labelled tasks, at experiment=laptop's budget,
is bench/ABLATION_STUDY.md (`bench/pretraining_pays.py --ablation`).

    python bench/ablation_study.py --model bert_mini --steps 200 --seeds 1,2,3 --out outputs/ablation_study \
        --report bench/results/ablation_word_order.md

It runs the recipe of docs/sweeps.md, "Reproducing the paper's ablations", as a user would, four commands:

1. `src/train.py task=pretrain sweep=objectives` on the demo corpus (Python's documentation, shipped with Python):
   mlm_nsp, mlm and ltr, each with every seed, `--steps` steps of batch 32, sequences of 128, at a learning rate
   of 5e-4 (the paper's 1e-4 left a 200-step bert_mini at unigram statistics: masked-token accuracy 0.057, every
   fine-tuned row at chance; the report's first run);
2. `src/train.py task=glue/sst2` fine-tuning every pre-trained job (a multirun over init_from) on a downstream task
   made from real text without a download: sentences of the demo corpus as written (label 1) or with their words
   shuffled (label 0), word-order acceptability like CoLA, in SST-2's schema (`bench/finetune_vs_transformers.py`);
3. the LTR jobs fine-tuned again with `task.module.bilstm=true` (Table 5's "+ BiLSTM" row);
4. a control the paper does not need but a small study does: the same fine-tuning from a randomly initialised
   encoder (same size and tokenizer, one run per seed), to tell what pre-training at this budget added at all;
5. `python -m lightbert.analysis.paper_tables` on the sweeps: the table beside the paper's.

The report (`--report`) holds the table, the commands and each stage's wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_vs_transformers import word_order_task

from lightbert.analysis.paper_tables import Cell

REPO = Path(__file__).resolve().parents[1]


def run(command: list[str], log: Path) -> float:
    """Runs one command (its output to `log`); returns its wall time."""
    started = time.time()
    with log.open("w") as out:
        result = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        sys.exit(f"ablation_study.py: {' '.join(command[:4])} ... failed; see {log}")
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_mini")
    parser.add_argument("--steps", type=int, default=200, help="pre-training steps per job")
    parser.add_argument("--pretrain-lr", default="5e-4", help="pre-training learning rate (the paper's: 1e-4)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--objectives", default="mlm_nsp,mlm,ltr")
    parser.add_argument("--train-examples", type=int, default=8000)
    parser.add_argument("--dev-examples", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", default="1e-4", help="fine-tuning learning rate")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "ablation_study")
    parser.add_argument("--report", type=Path, default=None, help="also write the report here (e.g. bench/...md)")
    args = parser.parse_args()
    out = args.out.resolve()
    if out.exists():
        sys.exit(f"ablation_study.py: {out} exists; choose a new --out")
    out.mkdir(parents=True)
    python = sys.executable
    cache = out / "cache"
    files = word_order_task(cache, out / "data", args.train_examples, args.dev_examples, seed=0)
    pretrain = [
        python,
        "src/train.py",
        "-m",
        "task=pretrain",
        "sweep=objectives",
        f"model={args.model}",
        "trainer=cpu",
        f"trainer.max_steps={args.steps}",
        f"optim.lr={args.pretrain_lr}",
        # one validation, at the end: the table reads the final held-out loss, and each costs a pass over 5% of
        # the corpus
        f"task.cpu_val_check_interval={args.steps}",
        "logger=csv",
        f"task.objective={args.objectives}",
        f"seed={args.seeds}",
        f"paths.cache_dir={cache}",
        f"hydra.sweep.dir={out / 'pretrain'}",
    ]
    seconds = {"pre-training": run(pretrain, out / "pretrain.log")}
    jobs = sorted(p for p in (out / "pretrain").iterdir() if (p / "results.json").is_file())
    finetune = [
        python,
        "src/train.py",
        "-m",
        "task=glue/sst2",
        f"init_from={','.join(map(str, jobs))}",
        "trainer=cpu",
        "trainer.max_steps=-1",
        f"trainer.max_epochs={args.epochs}",
        f"optim.lr={args.lr}",
        "logger=csv",
        f"task.data_files.train={files['train']}",
        f"task.data_files.validation={files['validation']}",
        f"paths.cache_dir={cache}",
        f"hydra.sweep.dir={out / 'finetune'}",
    ]
    seconds["fine-tuning"] = run(finetune, out / "finetune.log")
    # Table 5's + BiLSTM row: the LTR jobs fine-tuned again with a BiLSTM between the encoder and the head.
    ltr = [j for j in jobs if yaml.safe_load((j / ".hydra" / "config.yaml").read_text())["task"]["objective"] == "ltr"]
    commands = [pretrain, finetune]
    finetune_dirs = [out / "finetune"]
    if ltr:
        bilstm = [
            *finetune[:4],
            f"init_from={','.join(map(str, ltr))}",
            *finetune[5:-1],
            "task.module.bilstm=true",
            f"hydra.sweep.dir={out / 'finetune_bilstm'}",
        ]
        seconds["fine-tuning + BiLSTM"] = run(bilstm, out / "finetune_bilstm.log")
        commands.append(bilstm)
        finetune_dirs.append(out / "finetune_bilstm")
    # The control: no pre-training. The first job's tokenizer (the demo corpus's, the same for every job) and a
    # random encoder of the same size, one run per seed.
    scratch = [
        *finetune[:4],
        f"model={args.model}",
        f"task.datamodule.tokenizer_path={jobs[0] / 'tokenizer.json'}",
        f"seed={args.seeds}",
        *finetune[5:-1],
        f"hydra.sweep.dir={out / 'finetune_scratch'}",
    ]
    seconds["fine-tuning from random init"] = run(scratch, out / "finetune_scratch.log")
    commands.append(scratch)
    scores = [json.loads(p.read_text())["best_score"] for p in (out / "finetune_scratch").glob("*/results.json")]
    control = Cell([100 * score for score in scores])
    tables = [python, "-m", "lightbert.analysis.paper_tables", str(out / "pretrain"), *map(str, finetune_dirs)]
    commands.append(tables)
    seconds["report"] = run(tables, out / "paper_tables.log")
    report = (out / "pretrain" / "paper_tables.md").read_text()
    shown = "\n".join(" ".join(["python", *c[1:]]) for c in commands)
    total = sum(seconds.values())
    timing = ", ".join(f"{name} {s / 60:.1f} min" for name, s in seconds.items())
    text = (
        f"{report}\nThe control, fine-tuned the same way from a randomly initialised {args.model} (no pre-training, "
        f"the same tokenizer): **{control.text()}**.\n\n## How this study ran\n\n"
        f"`python bench/ablation_study.py {' '.join(sys.argv[1:])}` ran, in "
        f"{total / 60:.1f} minutes ({timing}):\n\n```\n{shown}\n```\n\nThe downstream task: "
        f"{args.train_examples} training and {args.dev_examples} dev sentences of the demo corpus, as written "
        "(label 1) or with their words shuffled (label 0).\n"
    )
    (out / "ABLATION_STUDY.md").write_text(text)
    if args.report:
        args.report.write_text(text)
    print(f"ablation_study.py: {total / 60:.1f} minutes; report in {args.report or out / 'ABLATION_STUDY.md'}")


if __name__ == "__main__":
    main()
