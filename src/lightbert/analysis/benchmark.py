"""The paper's results tables from a benchmark's sweep directory (`experiment=glue_benchmark`, `squad_benchmark`):
`glue_table.md`/`.json` (Table 1's shape) or `squad_table.md`/`.json` (Tables 2 and 3), and the GLUE server's
`submission.zip`. `python -m lightbert.analysis.benchmark SWEEP_DIR` writes them again; the sweep summary
(lightbert.analysis.sweep) rewrites the tables after every job, so an interrupted benchmark shows what is done.

One row per checkpoint (init_from). Each task's cell is its best configuration on the dev set: the configuration
whose jobs have the highest mean of the task's monitor (GLUE's val/score, SQuAD's val/f1) over their seeds; the cell
holds the metrics the paper prints, in percent, as the mean ± sample std over those seeds where restarts ran. GLUE's
metrics are the dev-set values of each job's kept checkpoint (`results.json`'s `best_metrics`), SQuAD's the official
scores of its dev predictions (`predictions/eval.json`). The submission takes the best seed of each task's best
configuration: the paper "selected the best model on the Dev set" over its restarts.

The paper's rows beside ours: Table 1 is the GLUE *test* set (the server's scores), Tables 2 and 3 SQuAD's dev set.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

from lightbert.analysis.benchmark_plan import checkpoint_key, read_plan
from lightbert.errors import UserError, exits_on_user_error
from lightbert.files import RESULTS_FILE, replace_atomically, write_atomically

log = logging.getLogger(__name__)

# Each task's column as the paper prints it: its header and the metrics of the cell, in results.json's best_metrics
# (GLUE, fractions) or predictions/eval.json (SQuAD, percent).
COLUMNS = {
    "glue": [
        ("mnli", "MNLI-m/mm (acc)", ("val/accuracy_m", "val/accuracy_mm")),
        ("qqp", "QQP (F1/acc)", ("val/f1", "val/accuracy")),
        ("qnli", "QNLI (acc)", ("val/accuracy",)),
        ("sst2", "SST-2 (acc)", ("val/accuracy",)),
        ("cola", "CoLA (MCC)", ("val/mcc",)),
        ("stsb", "STS-B (Spearman)", ("val/spearman",)),
        ("mrpc", "MRPC (F1/acc)", ("val/f1", "val/accuracy")),
        ("rte", "RTE (acc)", ("val/accuracy",)),
        ("wnli", "WNLI (acc)", ("val/accuracy",)),
    ],
    "squad": [
        ("squad_v1", "SQuAD v1.1 (EM/F1)", ("exact_match", "f1")),
        ("squad_v2", "SQuAD v2.0 (EM/F1)", ("exact", "f1")),
    ],
}
AVERAGED = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")  # the paper's eight; never WNLI
AVERAGE = (
    "Average: the paper's (Table 1), the mean of the nine numbers its eight tasks give: MNLI-m and MNLI-mm each "
    "count, and every other task one score, that of a two-metric task (QQP, MRPC: F1/acc) the mean of its two, the "
    "GLUE leaderboard's convention (Table 1 prints F1 alone for them). Over Table 1's own columns this gives its "
    "printed averages, 79.6 and 82.1. WNLI is never averaged."
)
# The paper's rows, in percent, with each cell's numbers in the column's order (a paper row may have fewer).
PAPER_ROWS = {
    "glue": {
        "BERT_BASE (paper Table 1, GLUE test set)": {
            "mnli": [84.6, 83.4], "qqp": [71.2], "qnli": [90.5], "sst2": [93.5], "cola": [52.1], "stsb": [85.8],
            "mrpc": [88.9], "rte": [66.4], "average": 79.6,
        },
        "BERT_LARGE (paper Table 1, GLUE test set)": {
            "mnli": [86.7, 85.9], "qqp": [72.1], "qnli": [92.7], "sst2": [94.9], "cola": [60.5], "stsb": [86.5],
            "mrpc": [89.3], "rte": [70.1], "average": 82.1,
        },
    },
    "squad": {
        "BERT_BASE (paper Table 2, dev set)": {"squad_v1": [80.8, 88.5]},
        "BERT_LARGE (paper Tables 2 and 3, single, dev set)": {"squad_v1": [84.1, 90.9], "squad_v2": [78.7, 81.9]},
    },
}  # fmt: skip
TABLE_FILES = {"glue": "glue_table", "squad": "squad_table"}
SUBMISSION = "submission.zip"


def glue_average(cells: dict[str, list[float]]) -> float | None:
    """The paper's GLUE average (`AVERAGE`) of each task's printed numbers; None until all eight have one."""
    numbers = []
    for task in AVERAGED:
        values = cells.get(task)
        if not values:
            return None
        numbers += values if task == "mnli" else [statistics.mean(values)]
    return statistics.mean(numbers)


def _job_values(job_dir: Path, family: str, metrics: tuple[str, ...]) -> tuple[float, list[float]] | None:
    """A finished job's monitored best score and its cell's numbers (percent); None while it has none."""
    results_path = job_dir / RESULTS_FILE
    if not results_path.is_file():
        return None
    results = json.loads(results_path.read_text())
    if results.get("best_score") is None:
        return None  # no validation ran
    if family == "glue":
        source = {k: 100 * v for k, v in (results.get("best_metrics") or {}).items()}
    else:
        eval_path = job_dir / "predictions" / "eval.json"
        source = json.loads(eval_path.read_text()) if eval_path.is_file() else {}
    if not all(m in source for m in metrics):
        return None
    return float(results["best_score"]), [float(source[m]) for m in metrics]


def build(sweep_dir: Path) -> dict[str, Any]:
    """The table as data: one row per checkpoint, in the order the benchmark planned them, and the paper's rows."""
    recorded = read_plan(sweep_dir)
    if recorded is None:
        raise UserError(f"{sweep_dir} holds no benchmark (no benchmark.json): run experiment=glue_benchmark first")
    family, planned = recorded["family"], list(recorded["jobs"].values())
    columns = {task: metrics for task, _, metrics in COLUMNS[family]}
    rows = []
    for checkpoint in dict.fromkeys(job["checkpoint"] for job in planned):
        jobs = [job for job in planned if job["checkpoint"] == checkpoint]
        row: dict[str, Any] = {"checkpoint": checkpoint, "key": checkpoint_key(checkpoint), "tasks": {}}
        finished = failed = unscored = 0
        for task in dict.fromkeys(job["task"] for job in jobs):
            task_jobs = [job for job in jobs if job["task"] == task]
            groups: dict[str, list[tuple[dict, float, list[float]]]] = {}
            for job in task_jobs:
                values = _job_values(sweep_dir / job["name"], family, columns[task])
                failed += values is None and (sweep_dir / job["name"] / "failed.txt").is_file()
                unscored += values is None and (sweep_dir / job["name"] / RESULTS_FILE).is_file()
                if values is not None:
                    key = json.dumps(job["configuration"], sort_keys=True)
                    groups.setdefault(key, []).append((job, *values))
            done = sum(len(g) for g in groups.values())
            finished += done
            if not groups:
                continue
            # The best configuration by its mean score over seeds; the first planned of equal ones.
            best = max(groups.values(), key=lambda g: statistics.mean(score for _, score, _ in g))
            numbers = list(zip(*(values for _, _, values in best), strict=True))
            row["tasks"][task] = {
                "metrics": [
                    {"mean": statistics.mean(n), "std": statistics.stdev(n) if len(n) > 1 else None, "n": len(n)}
                    for n in numbers
                ],
                "metric_names": list(columns[task]),
                "configuration": best[0][0]["configuration"],
                "seeds": [job["seed"] for job, _, _ in best],
                "jobs": [job["name"] for job, _, _ in best],
                "best_job": max(best, key=lambda g: g[1])[0]["name"],  # the submission's: the best seed
                "finished": done,
                "planned": len(task_jobs),
            }
        if family == "glue":
            row["average"] = glue_average({t: [m["mean"] for m in c["metrics"]] for t, c in row["tasks"].items()})
        row.update(finished=finished, failed=failed, unscored=unscored, planned=len(jobs))
        rows.append(row)
    tasks = [task for task, _, _ in COLUMNS[family] if any(job["task"] == task for job in planned)]
    table = {"family": family, "sweep_dir": str(sweep_dir), "tasks": tasks, "rows": rows, "paper": PAPER_ROWS[family]}
    return table | ({"average": AVERAGE} if family == "glue" else {})


def _number(metric: dict) -> str:
    return f"{metric['mean']:.1f}" + (f" ± {metric['std']:.1f}" if metric["std"] is not None else "")


def markdown(table: dict) -> str:
    family = table["family"]
    columns = [c for c in COLUMNS[family] if c[0] in table["tasks"]]
    header = ["model", *(title for _, title, _ in columns)] + (["Average"] if family == "glue" else []) + ["jobs"]
    lines = [
        f"# {'GLUE' if family == 'glue' else 'SQuAD'} dev results of the benchmark in {table['sweep_dir']}",
        "",
        "Each task's best configuration on the dev set (the highest mean of the task's monitor over its seeds), in "
        "percent; mean ± std over seeds where restarts ran. "
        + (
            AVERAGE + " The paper's rows are its Table 1: test-set scores from the GLUE server, not dev-set ones."
            if family == "glue"
            else "EM and F1 are the official scores of the dev predictions. The paper's rows are its dev-set numbers."
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in table["rows"]:
        cells = [f"`{row['checkpoint']}`"]
        for task, _, _ in columns:
            cell = row["tasks"].get(task)
            cells.append("/".join(_number(m) for m in cell["metrics"]) if cell else "-")
        if family == "glue":
            cells.append(f"{row['average']:.1f}" if row["average"] is not None else "-")
        status = f"{row['finished']}/{row['planned']}" + (f", {row['failed']} failed" if row["failed"] else "")
        status += f", {row['unscored']} without a validation score" if row.get("unscored") else ""
        lines.append("| " + " | ".join(cells + [status]) + " |")
    for name, paper in table["paper"].items():
        cells = [name] + ["/".join(f"{v:.1f}" for v in paper.get(task, [])) or "-" for task, _, _ in columns]
        cells += [f"{paper['average']:.1f}"] if family == "glue" else []
        lines.append("| " + " | ".join(cells + [""]) + " |")
    lines += ["", "## Best configuration per task", ""]
    lines += ["| model | task | configuration | seeds | jobs done | best job |", "|---|---|---|---|---|---|"]
    for row in table["rows"]:
        for task, cell in row["tasks"].items():
            configuration = " ".join(f"{k}={v}" for k, v in cell["configuration"].items()) or "the task's own"
            lines.append(
                f"| `{row['key']}` | {task} | {configuration} | {', '.join(map(str, cell['seeds']))} | "
                f"{cell['finished']}/{cell['planned']} | {cell['best_job']} |"
            )
    lines += ["", "Every job, failed ones with their error: summary.md."]
    return "\n".join(lines) + "\n"


def write_tables(sweep_dir: Path) -> dict:
    """glue_table.md/.json or squad_table.md/.json in the sweep directory; returns the table."""
    table = build(sweep_dir)
    stem = TABLE_FILES[table["family"]]
    write_atomically(sweep_dir / f"{stem}.json", json.dumps(table, indent=2) + "\n")
    write_atomically(sweep_dir / f"{stem}.md", markdown(table))
    return table


def write_submissions(sweep_dir: Path, table: dict) -> tuple[list[Path], list[str]]:
    """submission.zip (one per checkpoint, `submission-<key>.zip`, when the directory holds several): the test TSVs
    of each task's best job under the GLUE server's names, AX.tsv from the MNLI model's. Refused, writing none, when a
    task of the benchmark has no finished job or its best job no test predictions. Returns the files and notes."""
    if table["family"] != "glue":
        return [], []
    try:
        zips, notes = _submission_files(sweep_dir, table)
    except UserError as error:
        # A zip from before would stand beside a table it no longer matches (a job since rerun or its files gone).
        stale = [p for p in (sweep_dir / SUBMISSION, *sorted(sweep_dir.glob("submission-*.zip"))) if p.is_file()]
        for path in stale:
            path.unlink()
        if stale:
            raise UserError(f"{error} (the earlier {', '.join(p.name for p in stale)} is removed)") from None
        raise
    for path, files in zips.items():  # only once every row can be written: a refusal writes no zip
        replace_atomically(path, lambda tmp, files=files: _zip(tmp, files))
    return list(zips), notes


def _submission_files(sweep_dir: Path, table: dict) -> tuple[dict[Path, dict[str, Path]], list[str]]:
    """Each zip's files (server name -> the best job's predictions), checked; refused when one cannot be made."""
    from lightbert.tasks.glue.tasks import TASKS  # the server's file names, one per test split

    recorded = read_plan(sweep_dir) or {"jobs": {}}
    zips, notes = {}, []
    for row in table["rows"]:
        tasks = list(
            dict.fromkeys(j["task"] for j in recorded["jobs"].values() if j["checkpoint"] == row["checkpoint"])
        )
        files: dict[str, Path] = {}
        for task in tasks:
            cell = row["tasks"].get(task)
            no = f"no {SUBMISSION} for {row['checkpoint']}"
            if cell is None:
                task_jobs = [j["name"] for j in recorded["jobs"].values() if j["task"] == task]
                unscored = [n for n in task_jobs if (sweep_dir / n / RESULTS_FILE).is_file()]
                if unscored:
                    raise UserError(
                        f"{no}: {task}'s {len(unscored)} finished job(s) have no validation score, which picks the "
                        f"task's best job: {_why_unscored(sweep_dir / unscored[0])}. Run the benchmark with "
                        "validation into another directory, hydra.sweep.dir=..."
                    )
                raise UserError(
                    f"{no}: {task} has no finished job in {sweep_dir} yet; run the same benchmark command again to "
                    "finish it"
                )
            spec = TASKS[task]
            job_dir = sweep_dir / cell["best_job"]
            written = {Path(p).name for p in json.loads((job_dir / RESULTS_FILE).read_text()).get("predictions") or []}
            for split, name in zip(spec.test_splits, spec.submission_files, strict=True):
                path = job_dir / "predictions" / name
                if not path.is_file() and name in written:
                    raise UserError(
                        f"{no}: {path} is gone (the job wrote it; it was deleted or moved since). Delete {job_dir} "
                        "and run the same benchmark command again: that job runs again"
                    )
                if not path.is_file():
                    raise UserError(
                        f"{no}: {task}'s best job ({job_dir}) has no test predictions for {split} ({name}): it ran "
                        f"without that test file. Run the benchmark with every test file (benchmark.data_dir=DIR with "
                        f"DIR/{task}/{split}.tsv, or the hub's data) into another directory, hydra.sweep.dir=..."
                    )
                if not path.read_bytes().strip():
                    raise UserError(
                        f"{no}: {path} is empty (0 bytes; a job writes a header line at least). Delete {job_dir} "
                        "and run the same benchmark command again: that job runs again"
                    )
                files[name] = path
        if "wnli" not in tasks:
            notes.append(
                "WNLI.tsv is not in it (benchmark.wnli=false, as in the paper); the GLUE server asks for every task: "
                "add benchmark.wnli=true to the same command (finished jobs are skipped)"
            )
        name = SUBMISSION if len(table["rows"]) == 1 else f"submission-{row['key']}.zip"
        zips[sweep_dir / name] = files
    return zips, notes


def _why_unscored(job_dir: Path) -> str:
    """Why a finished job has no validation score, from its results.json and its config (.hydra/config.yaml)."""
    results = json.loads((job_dir / RESULTS_FILE).read_text())
    if results.get("best_score") is not None:
        return (
            f"{job_dir} validated, but the metrics of the task's column are missing (results.json's best_metrics come "
            "from its metrics.csv, SQuAD's from predictions/eval.json)"
        )
    config_path = job_dir / ".hydra" / "config.yaml"
    trainer = (yaml.safe_load(config_path.read_text()) or {}).get("trainer") or {} if config_path.is_file() else {}
    every, epochs = trainer.get("check_val_every_n_epoch") or 1, trainer.get("max_epochs")
    if trainer.get("limit_val_batches") == 0:
        return f"{job_dir} ran with trainer.limit_val_batches=0, which runs no validation"
    if isinstance(epochs, int) and every > epochs:
        return (
            f"{job_dir} ran with trainer.check_val_every_n_epoch={every}, more than its trainer.max_epochs={epochs}, "
            "so no epoch ended with a validation"
        )
    return f"{job_dir} ended at step {results.get('global_step')} before its first validation (trainer.max_steps?)"


def _zip(path: Path, files: dict[str, Path]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, source in sorted(files.items()):
            archive.write(source, arcname=name)


def end_of_benchmark(sweep_dir: Path) -> None:
    """After the multirun's last job: the tables once more and the submission, each said in one line; a
    submission that cannot be made is one line saying why, and the benchmark's jobs stand."""
    table = write_tables(sweep_dir)
    print(f"lightbert: {TABLE_FILES[table['family']]}.md in {sweep_dir}")
    try:
        written, notes = write_submissions(sweep_dir, table)
    except UserError as error:
        print(f"lightbert: {error}", file=sys.stderr)
        return
    for path in written:
        print(f"lightbert: {path.name} in {sweep_dir} ({len(zipfile.ZipFile(path).namelist())} files)")
    for note in notes:
        print(f"lightbert: {note}")


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lightbert.analysis.benchmark", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("sweep_dir", type=Path, help="the benchmark's sweep directory (hydra.sweep.dir)")
    args = parser.parse_args(argv)
    table = write_tables(args.sweep_dir)
    written, notes = write_submissions(args.sweep_dir, table)
    print(
        f"lightbert: {TABLE_FILES[table['family']]}.md"
        + "".join(f", {p.name}" for p in written)
        + f" in {args.sweep_dir}"
    )
    for note in notes:
        print(f"lightbert: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
