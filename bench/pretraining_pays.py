"""Does pre-training pay off on real labelled data? The paper's claim on a laptop (docs/pretraining-pays.md).

    python bench/pretraining_pays.py --out outputs/pays --report bench/results/pretraining_pays.md
    python bench/pretraining_pays.py --quick        # the regression guard: one recipe, one seed, a few CPU-minutes

1. Real data, offline (`bench/real_data.py`): a 1.5M-word English corpus, part-of-speech tags of the Penn Treebank's
   WSJ sample (token level) and Pang & Lee's sentence polarity (sentence level), both labelled by people.
2. Each recipe pre-trains on the corpus as a user runs it (`src/train.py experiment=<recipe> corpus=text ...`) for
   the steps that fit the CPU budget on this machine (one thread a process, `--jobs` processes at once); its CPU time
   is measured (the process's user + system time) and reported.
3. Each task is fine-tuned from the pre-trained run and from the same network at random init (the run's model
   settings and tokenizer, the same steps), `--seeds` x `--lrs`, as `src/train.py -m task=... seed=... optim.lr=...`.
   A cell is the mean and standard deviation over the seeds at the learning rate with the best mean, chosen for each
   of the two starts on its own. Pre-training pays when the gain is more than twice the larger seed spread.
4. `--curve`: the sentence task again from the run's checkpoints at 1/4 and 1/2 of its steps (the learning curve:
   gain against pre-training CPU-minutes). `--ablation`: Table 5's rows at the laptop recipe's budget, both tasks
   (`task.objective=mlm`, `ltr`, `ltr` + a BiLSTM at fine-tuning), written to `--ablation-report`.
   `--ceiling MODEL`: a released model (a Hugging Face directory or hub id, which needs a network) fine-tuned the same
   way.

Every run's directory and log stay under `--out`; a run whose results.json exists is read, not run again, so an
interrupted study continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from real_data import prepare  # noqa: E402

# recipe: (experiment, steps): about 11 CPU-minutes each on this project's 2-core machine, one thread a process
RECIPES = {"paper": ("quick_start", 12000), "modern": ("modern_quick_start", 9000), "laptop": ("laptop", 7000)}
TASKS = {  # task: (task=..., its files, epochs, the score)
    "pos": ("pos_tagging", {"train": "pos/train.txt", "validation": "pos/validation.txt"}, 20, "word accuracy"),
    "sentiment": ("glue/sst2", {"train": "sentiment/train.jsonl", "validation": "sentiment/validation.jsonl"}, 3,
                  "accuracy"),
}  # fmt: skip
ABLATION = {"mlm": "No NSP", "ltr": "LTR & No NSP"}
# `--ladder`: the changes from the paper's quick start toward a recipe for a small budget, each measured on its own
# (the paper's objectives throughout: masked LM at 15% + NSP on sentence pairs). A rung is (what, its overrides, kept):
# a kept change stays in every rung below it; one that measured worse is reported and left out of the rungs below.
LADDER = [
    ("the quick start (bert_tiny, post-LN, dropout 0.1, AdamW lr 1e-3, linear decay, 64 tokens x 8)", [], True),
    ("no dropout", ["model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0"], True),
    ("pre-LayerNorm", ["model.norm_position=pre", "model.final_norm=true"], True),
    ("lr 2e-3", ["optim.lr=2e-3"], False),  # held-out MLM accuracy 0.102 at step 3000, against 0.127 at 1e-3
    ("4 layers", ["model.num_hidden_layers=4"], True),
    ("128 tokens x 4", ["task.max_seq_length=128", "task.batch_size=4"], True),
    ("8,000 WordPiece tokens", ["task.datamodule.vocab_size=8000"], True),
    ("rotary positions", ["model.position_embedding_type=rotary"], True),
]
CURVE_POINTS = (1, 2)  # quarters of the run's steps (1/4, 1/2); the run itself is the last point


@dataclass
class Job:
    name: str
    command: list[str]
    done: Path  # exists when the job has run
    log: Path
    cpu_s: float = 0.0
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


def run_jobs(jobs: list[Job], parallel: int, threads: int) -> None:
    """Each job's command, `parallel` at a time, each process on `threads` threads; CPU and wall time recorded in
    `<log>.time.json` (read back for jobs that already ran)."""
    pending = [j for j in jobs if not j.done.exists()]
    for job in jobs:
        timing = job.log.with_suffix(".time.json")
        if job.done.exists() and timing.exists():
            job.cpu_s, job.wall_s = json.loads(timing.read_text())
    running: dict[int, tuple[Job, float]] = {}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            job.log.parent.mkdir(parents=True, exist_ok=True)
            print(f"pretraining_pays.py: {job.name} (log {job.log})", flush=True)
            with job.log.open("w") as log:
                process = subprocess.Popen(job.command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            running[process.pid] = (job, time.time())
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        job, started = running.pop(pid)
        job.cpu_s, job.wall_s = usage.ru_utime + usage.ru_stime, time.time() - started
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"pretraining_pays.py: {job.name} failed; see {job.log}")
        job.log.with_suffix(".time.json").write_text(json.dumps([job.cpu_s, job.wall_s]))


def pretrain_job(out: Path, data: Path, name: str, experiment: str, steps: int, *extra: str) -> Job:
    run = out / "pretrain" / name
    quarter = max(1, steps // 4)
    curve = (f"+callbacks.curve={{_target_:lightning.pytorch.callbacks.ModelCheckpoint,dirpath:{run}/checkpoints/curve,"
             f'filename:"step{{step}}",auto_insert_metric_name:false,every_n_train_steps:{quarter},save_top_k:-1,'
             "monitor:null,save_weights_only:true}")  # fmt: skip
    command = [sys.executable, "src/train.py", f"experiment={experiment}", "corpus=text",
               f"corpus.paths=[{data / 'corpus.txt'}]", "logger=csv", f"trainer.max_steps={steps}",
               f"task.cpu_val_check_interval={quarter}", "task.datamodule.validation_documents=100",
               f"paths.cache_dir={out / 'cache'}", f"hydra.run.dir={run}", curve, *extra]  # fmt: skip
    return Job(f"pre-train {name}", command, run / "results.json", out / "logs" / f"pretrain_{name}.log")


def random_init(run: Path) -> list[str]:
    """The overrides that build the run's network at random init: its model group and every model setting, and its
    tokenizer."""
    hydra = yaml.safe_load((run / ".hydra" / "hydra.yaml").read_text())["hydra"]
    model = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["model"]
    return [f"model={hydra['runtime']['choices']['model']}", f"task.datamodule.tokenizer_path={run / 'tokenizer.json'}",
            *(f"model.{key}={json.dumps(value)}" for key, value in model.items())]  # fmt: skip


def finetune_job(out: Path, data: Path, name: str, task: str, start: list[str], seeds, lrs, *extra: str) -> Job:
    """`--seeds` x `--lrs` fine-tunings of one task from one start, one multirun."""
    task_name, files, epochs, _ = TASKS[task]
    sweep = out / "finetune" / name / task
    command = [sys.executable, "src/train.py", "-m", f"task={task_name}", *start, "trainer=cpu", "logger=csv",
               "trainer.max_steps=-1", f"trainer.max_epochs={epochs}", f"seed={','.join(map(str, seeds))}",
               f"optim.lr={','.join(map(str, lrs))}", *(f"task.data_files.{s}={data / f}" for s, f in files.items()),
               f"paths.cache_dir={out / 'cache'}", f"hydra.sweep.dir={sweep}", *extra]  # fmt: skip
    last = sweep / str(len(seeds) * len(lrs) - 1) / "results.json"
    return Job(f"fine-tune {task} from {name}", command, last, out / "logs" / f"finetune_{name}_{task}.log")


def scores(sweep: Path) -> dict[float, list[float]]:
    """Each learning rate's best dev scores (one a seed) in a fine-tuning multirun."""
    found: dict[float, list[float]] = {}
    for results in sorted(sweep.glob("*/results.json")):
        config = yaml.safe_load((results.parent / ".hydra" / "config.yaml").read_text())
        found.setdefault(float(config["optim"]["lr"]), []).append(100 * json.loads(results.read_text())["best_score"])
    return found


def best(by_lr: dict[float, list[float]]) -> tuple[float, float, float, int]:
    """(mean, standard deviation, lr, n) at the learning rate with the best mean."""
    lr = max(by_lr, key=lambda k: statistics.mean(by_lr[k]))
    values = by_lr[lr]
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0, lr, len(values)


def cell(stats) -> str:
    mean, spread, lr, n = stats
    return f"{mean:.1f} ± {spread:.1f} (lr {lr:g}, n={n})"


def gain_cells(pre, rand) -> list[str]:
    gain, spread = pre[0] - rand[0], max(pre[1], rand[1])
    return [f"{gain:+.1f}", f"{2 * spread:.1f}", "**yes**" if gain > 2 * spread else "no"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="default: outputs/pays (--quick: outputs/regression_guard)")
    parser.add_argument("--data", type=Path, help="bench/real_data.py's output (default: <out>/data, made if missing)")
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"of {', '.join(RECIPES)}")
    parser.add_argument("--steps", default="", help="pre-training steps per recipe, e.g. laptop=3000")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"of {', '.join(TASKS)}")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--lrs", default="1e-4,5e-4", help="fine-tuning learning rates")
    parser.add_argument("--jobs", type=int, default=2, help="processes at once")
    parser.add_argument("--threads", type=int, default=1, help="threads a process")
    parser.add_argument("--curve", action="store_true", help="the sentence task from 1/4 and 1/2 of pre-training")
    parser.add_argument("--ablation", action="store_true", help="Table 5's rows at the laptop recipe")
    parser.add_argument("--ceiling", help="a released model fine-tuned the same way (a Hugging Face dir or hub id)")
    parser.add_argument("--ladder", action="store_true", help="LADDER's changes one at a time (--steps paper=N)")
    parser.add_argument(
        "--with", dest="extra", default="", help="overrides added to every pre-training, space-separated"
    )
    parser.add_argument("--quick", action="store_true", help="the regression guard: laptop, 3000 steps, one seed")
    parser.add_argument("--reference", type=Path, default=REPO / "bench" / "results" / "regression_guard.json",
                        help="--quick: the gain it is held to (written when missing)")  # fmt: skip
    parser.add_argument("--tolerance", type=float, default=3.0, help="--quick: points of gain it may lose")
    parser.add_argument("--report", type=Path)
    parser.add_argument("--ablation-report", type=Path)
    args = parser.parse_args()
    args.out = args.out or REPO / "outputs" / ("regression_guard" if args.quick else "pays")
    if args.quick:
        args.recipes, args.steps, args.seeds, args.lrs, args.tasks = "laptop", "laptop=3000", "1", "5e-4", "pos"
    recipes = {r: RECIPES[r] for r in args.recipes.split(",")}
    steps = {r: s for r, (_, s) in recipes.items()} | {
        k: int(v) for k, v in (p.split("=") for p in args.steps.split(",") if p)
    }
    tasks, seeds, lrs = (
        args.tasks.split(","),
        [int(s) for s in args.seeds.split(",")],
        [float(x) for x in args.lrs.split(",")],
    )
    out, started = args.out.resolve(), time.time()
    data = (args.data or out / "data").resolve()
    if not (data / "data.json").exists():
        prepare(data, REPO / ".cache" / "real_data")

    extra = args.extra.split()
    if args.ladder:
        return ladder(args, out, data, steps["paper"], tasks, seeds, lrs)
    if args.ladder:
        return ladder(args, out, data, steps["paper"], tasks, seeds, lrs)
    pretrain = {r: pretrain_job(out, data, r, experiment, steps[r], *extra) for r, (experiment, _) in recipes.items()}
    if args.ablation:
        for objective in ABLATION:
            name, objective_override = f"laptop_{objective}", f"task.objective={objective}"
            pretrain[name] = pretrain_job(out, data, name, "laptop", steps["laptop"], *extra, objective_override)
    run_jobs(list(pretrain.values()), args.jobs, args.threads)

    runs = {name: job.done.parent for name, job in pretrain.items()}
    finetunes = []
    for name, run in runs.items():
        for task in tasks:
            finetunes.append(finetune_job(out, data, name, task, [f"init_from={run}"], seeds, lrs))
            if name in recipes:
                finetunes.append(finetune_job(out, data, f"{name}_random", task, random_init(run), seeds, lrs))
            if name == "laptop_ltr":
                finetunes.append(finetune_job(out, data, "laptop_ltr_bilstm", task, [f"init_from={run}"], seeds, lrs,
                                              "task.module.bilstm=true"))  # fmt: skip
        if args.ceiling:
            finetunes += [
                finetune_job(out, data, "ceiling", t, [f"init_from={args.ceiling}"], seeds, lrs) for t in tasks
            ]
    run_jobs(finetunes, args.jobs, args.threads)

    table = {}  # (start, task) -> (mean, std, lr, n)
    for job in finetunes:
        start, task = job.done.parents[2].name, job.done.parents[1].name
        table[start, task] = best({lr: v for lr, v in scores(job.done.parents[1]).items() if lr in lrs})
    curve_rows, curve_jobs = [], []
    if args.curve:
        for name in recipes:
            for quarter in CURVE_POINTS:
                step = steps[name] // 4 * quarter
                checkpoint = runs[name] / "checkpoints" / "curve" / f"step{step}.ckpt"
                start = [f"init_from={checkpoint}", f"task.datamodule.tokenizer_path={runs[name] / 'tokenizer.json'}"]
                lr = table[name, "sentiment"][2]
                curve_jobs.append(finetune_job(out, data, f"{name}_step{step}", "sentiment", start, seeds, [lr]))
        run_jobs(curve_jobs, args.jobs, args.threads)
        for job in curve_jobs:
            name, step = job.done.parents[2].name.rsplit("_step", 1)
            curve_rows.append((name, int(step), best(scores(job.done.parents[1]))))

    lines = write_tables(args, recipes, steps, pretrain, table, tasks, curve_rows)
    every = [*pretrain.values(), *finetunes, *curve_jobs]
    cpu = sum(j.cpu_s for j in every) / 60
    how = f"{len(every)} jobs, {args.jobs} processes of {args.threads} thread each at once"
    command = "python bench/pretraining_pays.py " + " ".join(sys.argv[1:])
    lines += ["", f"The study's jobs took {cpu:.0f} CPU-minutes in all ({how}; this command's own wall time "
              f"{(time.time() - started) / 60:.1f} minutes: runs already done are read, not run again).", "",
              "```", command, "```"]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    if args.quick:
        guard(args, table, pretrain["laptop"])


def guard(args, table, job: Job) -> None:
    """The regression guard's verdict: the laptop recipe's gain on the token task against the reference's."""
    pre, rand = table["laptop", "pos"], table["laptop_random", "pos"]
    found = {"pretrained": pre[0], "random_init": rand[0], "gain": pre[0] - rand[0], "cpu_minutes": job.cpu_s / 60}
    if not args.reference.exists():
        args.reference.write_text(json.dumps(found, indent=1) + "\n")
        print(f"regression guard: gain {found['gain']:+.1f} points, written as the reference {args.reference}")
        return
    reference = json.loads(args.reference.read_text())
    verdict = f"gain {found['gain']:+.1f} points (pre-trained {pre[0]:.1f}, random init {rand[0]:.1f}); reference "
    verdict += f"{reference['gain']:+.1f} ({args.reference})"
    if found["gain"] < reference["gain"] - args.tolerance:
        sys.exit(f"regression guard FAILED: {verdict}, more than {args.tolerance} points lower")
    print(f"regression guard passed: {verdict}")


def ladder(args, out: Path, data: Path, steps: int, tasks, seeds, lrs) -> None:
    """LADDER's rungs, each pre-trained for `steps`, and `tasks` fine-tuned from it and from its net at random init."""
    pretrain, overrides = [], []
    for rung, (_, changes, kept) in enumerate(LADDER):
        pretrain.append(pretrain_job(out, data, f"rung{rung}", "quick_start", steps, *overrides, *changes))
        overrides += changes if kept else []
    run_jobs(pretrain, args.jobs, args.threads)
    finetunes = {}
    for rung, job in enumerate(pretrain):
        for task in tasks:
            run, name = job.done.parent, f"rung{rung}"
            from_run = finetune_job(out, data, name, task, [f"init_from={run}"], seeds, lrs)
            finetunes[rung, task] = (
                from_run,
                finetune_job(out, data, f"{name}_random", task, random_init(run), seeds, lrs),
            )
    run_jobs([j for pair in finetunes.values() for j in pair], args.jobs, args.threads)
    header = " | ".join(f"{t}: pre-trained | {t}: random init | {t}: gain" for t in tasks)
    lines = [f"| change (added to the kept ones above) | val/mlm_accuracy | CPU-minutes | {header} |",
             "|---|---|---|" + "---|---|---|" * len(tasks)]  # fmt: skip
    for rung, job in enumerate(pretrain):
        mlm = json.loads(job.done.read_text())["metrics"]["val/mlm_accuracy"]
        what, _, kept = LADDER[rung]
        cells = [what if kept else f"{what} (worse: left out below)", f"{mlm:.3f}", f"{job.cpu_s / 60:.1f}"]
        for task in tasks:
            pre, rand = (best(scores(j.done.parents[1])) for j in finetunes[rung, task])
            cells += [cell(pre), cell(rand), f"{pre[0] - rand[0]:+.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    command = "python bench/pretraining_pays.py " + " ".join(sys.argv[1:])
    text = "\n".join([*lines, "", "```", command, "```"]) + "\n"
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)


def trend(curve: list[tuple[float, float]], needed: float) -> str:
    """The least-squares line of gain against log2(CPU-minutes): the gain a doubling of pre-training adds, and the
    budget at which the line reaches `needed` (an extrapolation, said as one)."""
    xs, ys = [math.log2(m) for m, _ in curve], [g for _, g in curve]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        return f"trend: {slope:+.1f} points a doubling: no budget in reach"
    minutes = 2 ** (mx + (needed - my) / slope)
    return f"trend: {slope:+.1f} points a doubling; extrapolated to pay ({needed:.1f} points) at ~{minutes:.0f} CPU-min"


def write_tables(args, recipes, steps, pretrain, table, tasks, curve_rows) -> list[str]:
    lines = []
    for task in tasks:
        lines += [f"### {task}: dev {TASKS[task][3]} (%), mean ± standard deviation over seeds", "",
                  "| recipe | pre-training | CPU-minutes | pre-trained | random init | gain | 2 x spread | pays |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for name in recipes:
            pre, rand = table[name, task], table[f"{name}_random", task]
            job = pretrain[name]
            cells = [
                name,
                f"{steps[name]} steps",
                f"{job.cpu_s / 60:.1f}",
                cell(pre),
                cell(rand),
                *gain_cells(pre, rand),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        if ("ceiling", task) in table:
            lines.append(f"| ceiling: {args.ceiling} | released | - | {cell(table['ceiling', task])} | | | | |")
        lines.append("")
    if curve_rows:
        lines += ["### sentiment: the learning curve (gain against pre-training CPU-minutes)", "",
                  "| recipe | step | CPU-minutes | pre-trained | gain over random init |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name in recipes:
            points = sorted((s, stats) for n, s, stats in curve_rows if n == name) + [
                (steps[name], table[name, "sentiment"])
            ]
            random = table[f"{name}_random", "sentiment"]
            curve = []
            for step, stats in points:
                minutes = pretrain[name].cpu_s / 60 * step / steps[name]
                curve.append((minutes, stats[0] - random[0]))
                lines.append(f"| {name} | {step} | {minutes:.1f} | {cell(stats)} | {curve[-1][1]:+.1f} |")
            lines.append(f"| {name} | | | | {trend(curve, 2 * max(random[1], points[-1][1][1]))} |")
        lines.append("")
    if args.ablation:
        ablation = [
            "| row | " + " | ".join(tasks) + " | pre-training CPU-minutes |",
            "|---|" + "---|" * (len(tasks) + 1),
        ]
        rows = {"BERT (MLM + NSP)": "laptop", "No NSP": "laptop_mlm", "LTR & No NSP": "laptop_ltr",
                "+ BiLSTM": "laptop_ltr_bilstm", "no pre-training (random init)": "laptop_random"}  # fmt: skip
        for label, start in rows.items():
            job = pretrain.get(start.removesuffix("_bilstm"))
            minutes = f"{job.cpu_s / 60:.1f}" if job and start != "laptop_random" else "-"
            ablation.append(f"| {label} | " + " | ".join(cell(table[start, t]) for t in tasks) + f" | {minutes} |")
        print("\n".join(ablation))
        if args.ablation_report:
            args.ablation_report.write_text("\n".join(ablation) + "\n")
    return lines


if __name__ == "__main__":
    main()
