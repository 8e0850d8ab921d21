"""The paper's ablation tables beside a study's own:
`python -m lightbert.analysis.paper_tables PRETRAIN FINETUNE [...]`.

PRETRAIN is the sweep directory of the pre-training jobs (or one pre-training run), FINETUNE one or more sweep
directories of fine-tuning jobs whose `init_from` is one of those jobs or a checkpoint of one (docs/sweeps.md,
"Reproducing the paper's ablations"). What the pre-training jobs differ in picks the table:

- `task.objective`: Table 5 (pre-training tasks: BERT, No NSP, LTR & No NSP);
- `task.datamodule.masking`: Table 8 (masking procedures);
- the model's sizes: Table 6 (model size), with each job's held-out MLM perplexity, exp(val/mlm_loss);
- fine-tuned checkpoints of several steps of one run (experiment=pretraining_steps): Figure 5, a table and
  `figure5.png` of the fine-tuned score against the pre-training step.

Each cell is the mean ± standard deviation of the fine-tuned runs' best dev score (`results.json`'s
`best_score`, in percent as the paper prints it) over the jobs that share the row, usually seeds; beside it, the
paper's number for the same task where the paper has one. The paper's numbers are BERT_BASE-sized models
pre-trained for 1M steps on 3.3B words and fine-tuned on the full datasets; a small study can show directions, not
values. Writes `paper_tables.md` and `paper_tables.json` (the same numbers) into PRETRAIN.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lightbert.errors import UserError, exits_on_user_error, require_extra
from lightbert.files import RESULTS_FILE, write_atomically

# The paper's dev-set numbers (Devlin et al. 2019), by lightbert task name.
PAPER_TABLE_5 = {  # Table 5: pre-training tasks, BERT_BASE
    "mlm_nsp": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst2": 92.7, "squad_v1": 88.5},
    "mlm": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst2": 92.6, "squad_v1": 87.9},
    "ltr": {"mnli": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst2": 92.1, "squad_v1": 77.8},
    "ltr+bilstm": {"mnli": 82.1, "qnli": 84.1, "mrpc": 75.7, "sst2": 91.6, "squad_v1": 84.9},  # + BiLSTM at fine-tuning
}
TABLE_5_ROWS = {"mlm_nsp": "BERT (MLM + NSP)", "mlm": "No NSP", "ltr": "LTR & No NSP", "ltr+bilstm": "+ BiLSTM"}
PAPER_TABLE_6 = {  # Table 6: (layers, hidden, heads) -> held-out MLM perplexity and dev accuracy
    (3, 768, 12): {"ppl": 5.84, "mnli": 77.9, "mrpc": 79.8, "sst2": 88.4},
    (6, 768, 3): {"ppl": 5.24, "mnli": 80.6, "mrpc": 82.2, "sst2": 90.7},
    (6, 768, 12): {"ppl": 4.68, "mnli": 81.9, "mrpc": 84.8, "sst2": 91.3},
    (12, 768, 12): {"ppl": 3.99, "mnli": 84.4, "mrpc": 86.7, "sst2": 92.9},
    (12, 1024, 16): {"ppl": 3.54, "mnli": 85.7, "mrpc": 86.9, "sst2": 93.3},
    (24, 1024, 16): {"ppl": 3.23, "mnli": 86.6, "mrpc": 87.8, "sst2": 93.7},
}
PAPER_TABLE_8 = {  # Table 8: (MASK, SAME, RND) -> MNLI fine-tuned, NER fine-tuned, NER feature-based
    (0.8, 0.1, 0.1): {"mnli": 84.2, "conll2003": 95.4, "conll2003_features": 94.9},
    (1.0, 0.0, 0.0): {"mnli": 84.3, "conll2003": 94.9, "conll2003_features": 94.0},
    (0.8, 0.0, 0.2): {"mnli": 84.1, "conll2003": 95.2, "conll2003_features": 94.6},
    (0.8, 0.2, 0.0): {"mnli": 84.4, "conll2003": 95.2, "conll2003_features": 94.7},
    (0.0, 0.2, 0.8): {"mnli": 83.7, "conll2003": 94.8, "conll2003_features": 94.6},
    (0.0, 0.0, 1.0): {"mnli": 83.6, "conll2003": 94.9, "conll2003_features": 94.6},
}
FIGURE_5 = (
    "The paper's Figure 5 plots MNLI dev accuracy of BERT_BASE fine-tuned from checkpoints at 200k to 1M "
    "pre-training steps: it rises all along (almost 1.0 point from 500k to 1M steps), and the MLM model starts "
    "below the LTR one but overtakes it almost at once."
)
SCALE_NOTE = (
    "The paper's numbers are BERT_BASE-sized models pre-trained for 1M steps of 256 sequences on 3.3B words and "
    "fine-tuned on the full datasets; this study's are its own sizes, corpus and data. A small study can show "
    "directions, not values. Scores are percent; each cell is the mean ± standard deviation over the fine-tuned "
    "runs that share the row (n), usually seeds."
)
STEP = re.compile(r"step[=-]?(\d+)")


@dataclass
class PretrainJob:
    path: Path
    objective: str
    masking: tuple[float, float, float]
    sizes: tuple[int, int, int]  # layers, hidden, heads
    mlm_loss: float | None


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return statistics.mean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def text(self) -> str:
        return f"{self.mean:.1f} ± {self.std:.1f} (n={len(self.values)})"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _jobs(directory: Path) -> list[Path]:
    """A sweep's finished job directories, or the directory itself when it is one finished run."""
    if (directory / RESULTS_FILE).is_file():
        return [directory]
    if not directory.is_dir():
        raise UserError(f"{directory} does not exist")
    return sorted(p for p in directory.iterdir() if (p / RESULTS_FILE).is_file() and (p / ".hydra").is_dir())


def pretrain_jobs(directory: Path) -> list[PretrainJob]:
    jobs = []
    for path in _jobs(directory):
        config = _yaml(path / ".hydra" / "config.yaml") or {}
        task, model = config.get("task") or {}, config.get("model") or {}
        if task.get("name") != "pretrain":
            continue
        masking = (task.get("datamodule") or {}).get("masking") or {}
        shares = tuple(float(masking.get(k, d)) for k, d in (("mask", 0.8), ("same", 0.1), ("random", 0.1)))
        metrics = json.loads((path / RESULTS_FILE).read_text()).get("metrics") or {}
        jobs.append(
            PretrainJob(
                path.resolve(),
                str(task.get("objective", "mlm_nsp")),
                shares,
                (model.get("num_hidden_layers"), model.get("hidden_size"), model.get("num_attention_heads")),
                metrics.get("val/mlm_loss"),
            )
        )
    if not jobs:
        raise UserError(f"{directory} holds no finished pre-training run (task=pretrain with a {RESULTS_FILE})")
    return jobs


def _percent(task: str, value: float) -> float:
    return value if task.startswith("squad") else 100 * value  # SQuAD's official scores are percent already


def finetune_rows(directories: list[Path], pretrained: list[PretrainJob]) -> list[dict]:
    """Each finished fine-tuning job: its task, best score (percent), the pre-training job and step it started from."""
    by_path = {job.path: job for job in pretrained}
    rows = []
    for directory in directories:
        for path in _jobs(directory):
            config = _yaml(path / ".hydra" / "config.yaml") or {}
            init_from = config.get("init_from")
            if not init_from:
                continue
            start = Path(str(init_from)).expanduser().resolve()
            job = by_path.get(start) or by_path.get(start.parent.parent)  # a run, or <run>/checkpoints/x.ckpt
            results = json.loads((path / RESULTS_FILE).read_text())
            if job is None or results.get("best_score") is None:
                continue
            task = (config.get("task") or {}).get("name", "")
            step = STEP.search(start.name) if start.suffix == ".ckpt" else None
            rows.append(
                {
                    "task": task,
                    "score": _percent(task, float(results["best_score"])),
                    "job": job,
                    "step": int(step[1]) if step else None,
                    # Table 5's + BiLSTM row: a BiLSTM added at fine-tuning (task.module.bilstm=true)
                    "bilstm": bool(((config.get("task") or {}).get("module") or {}).get("bilstm", False)),
                }
            )
    if not rows:
        raise UserError(
            "no fine-tuning job started from one of the pre-training jobs (init_from= a job's directory or one of "
            "its checkpoints); give the fine-tuning sweep directories after the pre-training one"
        )
    return rows


def which_table(pretrained: list[PretrainJob], rows: list[dict]) -> str:
    if len({r["step"] for r in rows}) > 1:
        return "figure5"
    for table, attribute in (("table5", "objective"), ("table8", "masking"), ("table6", "sizes")):
        if len({getattr(job, attribute) for job in pretrained}) > 1:
            return table
    raise UserError("the pre-training jobs differ in none of task.objective, task.datamodule.masking or model sizes")


def _row_key(table: str, job: PretrainJob, step: int | None, bilstm: bool = False):
    if table == "figure5":
        return (job.objective, step)
    objective = f"{job.objective}+bilstm" if bilstm else job.objective
    return {"table5": objective, "table8": job.masking, "table6": job.sizes}[table]


def _row_name(table: str, key) -> str:
    if table == "table5":
        return TABLE_5_ROWS.get(key, key)
    if table == "table8":
        return " / ".join(f"{share:.0%}" for share in key)
    if table == "table6":
        return "L={} H={} A={}".format(*key)
    return f"{TABLE_5_ROWS.get(key[0], key[0])}, step {key[1]}"


def _row_order(table: str, keys: list) -> list:
    if table == "table5":
        return sorted(keys, key=lambda k: list(TABLE_5_ROWS).index(k) if k in TABLE_5_ROWS else 99)
    if table == "table8":
        order = list(PAPER_TABLE_8)
        return sorted(keys, key=lambda k: order.index(k) if k in order else 99)
    return sorted(keys)


def _paper(table: str, key) -> dict[str, float]:
    return {"table5": PAPER_TABLE_5, "table8": PAPER_TABLE_8, "table6": PAPER_TABLE_6}.get(table, {}).get(key, {})


TITLES = {
    "table5": "Table 5: pre-training tasks (paper §5.1)",
    "table6": "Table 6: model size (paper §5.2)",
    "table8": "Table 8: masking procedures, MASK / SAME / RND (paper Appendix C.2)",
    "figure5": "Figure 5: fine-tuned score against pre-training steps (paper Appendix C.1)",
}


def build(pretrain_dir: Path, finetune_dirs: list[Path]) -> dict:
    """The table as data: rows (in the paper's order) of cells per task, the paper's numbers beside them."""
    pretrained = pretrain_jobs(pretrain_dir)
    rows = finetune_rows(finetune_dirs, pretrained)
    table = which_table(pretrained, rows)
    tasks = sorted({r["task"] for r in rows})
    cells: dict[Any, dict[str, Cell]] = {}
    for r in rows:
        cells.setdefault(_row_key(table, r["job"], r["step"], r["bilstm"]), {}).setdefault(
            r["task"], Cell()
        ).values.append(r["score"])
    out_rows = []
    for key in _row_order(table, list(cells)):
        row = {"row": _row_name(table, key), "scores": {}, "paper": _paper(table, key)}
        if table == "figure5":
            row["objective"], row["step"] = key
        for task in tasks:
            cell = cells[key].get(task)
            if cell is not None:
                row["scores"][task] = {"mean": cell.mean, "std": cell.std, "n": len(cell.values)}
        if table == "table6":
            losses = [j.mlm_loss for j in pretrained if j.sizes == key and j.mlm_loss is not None]
            row["perplexity"] = math.exp(statistics.mean(losses)) if losses else None
        out_rows.append(row)
    return {"table": table, "title": TITLES[table], "tasks": tasks, "rows": out_rows}


def markdown(result: dict, pretrain_dir: Path, finetune_dirs: list[Path]) -> str:
    table, tasks = result["table"], result["tasks"]
    paper_tasks = sorted({t for r in result["rows"] for t in r["paper"] if t != "ppl"} - set(tasks))
    header = ["row"]
    if table == "table6":
        header += ["MLM perplexity (held out)", "paper"]
    for task in tasks:
        header += [f"{task} (this study)", f"{task} (paper)"]
    header += [f"{task} (paper)" for task in paper_tasks]
    lines = [f"# {result['title']}", "", SCALE_NOTE, ""]
    lines += [f"Pre-training: `{pretrain_dir}`; fine-tuning: " + ", ".join(f"`{d}`" for d in finetune_dirs), ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["rows"]:
        cells = [row["row"]]
        if table == "table6":
            ppl = row.get("perplexity")
            cells += [f"{ppl:.2f}" if ppl is not None else "", _fmt(row["paper"].get("ppl"))]
        for task in tasks:
            score = row["scores"].get(task)
            cells.append(f"{score['mean']:.1f} ± {score['std']:.1f} (n={score['n']})" if score else "")
            cells.append(_fmt(row["paper"].get(task)))
        cells += [_fmt(row["paper"].get(task)) for task in paper_tasks]
        lines.append("| " + " | ".join(cells) + " |")
    if table == "figure5":
        lines += ["", FIGURE_5, "", "![Figure 5](figure5.png)"]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return f"{value:.2f}" if isinstance(value, float) and value < 10 else (f"{value:.1f}" if value is not None else "")


def figure5(result: dict, path: Path) -> None:
    require_extra("report", "figure5.png of python -m lightbert.analysis.paper_tables")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    for task in result["tasks"]:
        curves: dict[str, list[tuple[int, float]]] = {}
        for row in result["rows"]:
            if task in row["scores"]:
                name = TABLE_5_ROWS.get(row["objective"], row["objective"])
                curves.setdefault(name, []).append((row["step"], row["scores"][task]["mean"]))
        for objective, points in curves.items():
            points.sort()
            axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{objective}, {task}")
    axes.set_xlabel("pre-training steps")
    axes.set_ylabel("fine-tuned dev score (%)")
    axes.legend()
    figure.savefig(path, dpi=120, bbox_inches="tight")


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightbert.analysis.paper_tables", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("pretrain", type=Path, help="the pre-training sweep directory (or one pre-training run)")
    parser.add_argument("finetune", type=Path, nargs="+", help="fine-tuning sweep directories")
    args = parser.parse_args(argv)
    result = build(args.pretrain, args.finetune)
    write_atomically(args.pretrain / "paper_tables.json", json.dumps(result, indent=2) + "\n")
    write_atomically(args.pretrain / "paper_tables.md", markdown(result, args.pretrain, args.finetune))
    if result["table"] == "figure5":
        figure5(result, args.pretrain / "figure5.png")
    print(f"lightbert: {result['title']} in {args.pretrain / 'paper_tables.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
