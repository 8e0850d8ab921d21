"""The table at the end of a Hydra multirun: summary.csv and summary.md in the sweep directory.

A row per job: its overrides, status and best validation metric (the checkpoint monitor's best value, from
the job's results.json). summary.md adds the best configuration per task and, where jobs differ only in
`seed`, the mean and standard deviation over seeds. A benchmark's sweep (experiment=glue_benchmark) gets the paper's
tables beside them (lightbert.analysis.benchmark). Rewritten after every job, failed ones included, so an
interrupted or failing sweep still leaves the table of what ran.
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from lightbert.analysis.benchmark_plan import PLAN_FILE
from lightbert.errors import message_of
from lightbert.files import RESULTS_FILE, open_atomically, write_atomically

log = logging.getLogger(__name__)

FAILED_FILE = "failed.txt"
SUMMARY_CSV, SUMMARY_MD = "summary.csv", "summary.md"


def _job_dirs(sweep_dir: Path) -> list[Path]:
    jobs = [p for p in sweep_dir.iterdir() if (p / ".hydra" / "overrides.yaml").is_file()]
    return sorted(jobs, key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def _read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def job_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for job in _job_dirs(sweep_dir):
        overrides = dict(o.split("=", 1) for o in _read_yaml(job / ".hydra" / "overrides.yaml") or [] if "=" in o)
        config = _read_yaml(job / ".hydra" / "config.yaml") or {}
        task = config.get("task") or {}
        results = json.loads((job / RESULTS_FILE).read_text()) if (job / RESULTS_FILE).is_file() else None
        failed = (job / FAILED_FILE).read_text().strip() if (job / FAILED_FILE).is_file() else ""
        rows.append(
            {
                "job": job.name,
                "task": task.get("name", ""),
                "status": "ok" if results else ("failed" if failed else "running"),
                "overrides": overrides,
                "monitor": (results or {}).get("monitor") or task.get("monitor", ""),
                "mode": task.get("monitor_mode", "max"),
                "best": (results or {}).get("best_score"),
                "seconds": (results or {}).get("seconds"),
                "error": failed,
            }
        )
    return rows


def _varying_keys(rows: list[dict]) -> list[str]:
    keys = sorted({k for r in rows for k in r["overrides"]})
    return [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]


def best_per_task(rows: list[dict]) -> list[dict]:
    best = []
    for task in sorted({r["task"] for r in rows}):
        done = [r for r in rows if r["task"] == task and r["best"] is not None]
        if done:
            pick = max if done[0]["mode"] == "max" else min
            best.append(pick(done, key=lambda r: r["best"]))
    return best


def seed_groups(rows: list[dict]) -> list[dict]:
    """Jobs that differ only in `seed`, grouped: mean and sample std of the best metric (n >= 2 only)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["best"] is not None:
            key = (r["task"], tuple(sorted((k, v) for k, v in r["overrides"].items() if k != "seed")))
            groups.setdefault(key, []).append(r)
    out = []
    for (task, overrides), members in groups.items():
        if len({m["overrides"].get("seed") for m in members}) > 1:
            values = [m["best"] for m in members]
            out.append(
                {
                    "task": task,
                    "overrides": dict(overrides),
                    "n": len(values),
                    "mean": statistics.mean(values),
                    "std": statistics.stdev(values),
                    "monitor": members[0]["monitor"],
                }
            )
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]


def write_summary(sweep_dir: Path) -> list[dict]:
    rows = job_rows(sweep_dir)
    if not rows:
        return rows
    override_keys = sorted({k for r in rows for k in r["overrides"]})
    header = ["job", "task_name", "status", *override_keys, "monitor", "best", "seconds", "error"]
    with open_atomically(sweep_dir / SUMMARY_CSV, newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for r in rows:
            writer.writerow(
                [r["job"], r["task"], r["status"], *(r["overrides"].get(k, "") for k in override_keys)]
                + [r["monitor"], _fmt(r["best"]), _fmt(r["seconds"]), r["error"]]
            )

    varying = _varying_keys(rows)
    common = {k: v for k, v in rows[0]["overrides"].items() if k not in varying}
    lines = [f"# Sweep {sweep_dir}", ""]
    if common:
        lines += ["Common overrides: " + " ".join(f"`{k}={v}`" for k, v in sorted(common.items())), ""]
    lines += ["## Jobs", ""]
    errors = any(r["error"] for r in rows)  # a failed job's error, in its row, so the summary says why
    lines += _md_table(
        ["job", "task", "status", *varying, "monitor", "best", *(["error"] if errors else [])],
        [
            [
                r["job"],
                r["task"],
                r["status"],
                *(r["overrides"].get(k, "") for k in varying),
                r["monitor"],
                _fmt(r["best"]),
                *([r["error"].replace("\n", " ")] if errors else []),
            ]
            for r in rows
        ],
    )
    lines += ["", "## Best configuration per task", ""]
    lines += _md_table(
        ["task", "job", "overrides", "monitor", "best"],
        [
            [
                b["task"],
                b["job"],
                " ".join(f"{k}={b['overrides'][k]}" for k in varying if k in b["overrides"]),
                b["monitor"],
                _fmt(b["best"]),
            ]
            for b in best_per_task(rows)
        ],
    )
    groups = seed_groups(rows)
    if groups:
        lines += ["", "## Mean ± std over seeds", ""]
        lines += _md_table(
            ["task", "overrides", "seeds", "monitor", "mean ± std"],
            [
                [
                    g["task"],
                    " ".join(f"{k}={g['overrides'][k]}" for k in varying if k in g["overrides"]),
                    str(g["n"]),
                    g["monitor"],
                    f"{g['mean']:.4f} ± {g['std']:.4f}",
                ]
                for g in groups
            ],
        )
    lines += _feature_table(rows)
    write_atomically(sweep_dir / SUMMARY_MD, "\n".join(lines) + "\n")
    return rows


FEATURES_KEY = "task.features"


def _feature_table(rows: list[dict]) -> list[str]:
    """The paper's Table 7 for a sweep over `task.features` (conf/sweep/feature_layers.yaml): a row per layer
    combination, in the paper's order, with the best dev score of its job(s) (mean ± std over seeds)."""
    from lightbert.model.feature_based import layer_combinations  # the sweep callback stays light otherwise

    done = [r for r in rows if r["best"] is not None and FEATURES_KEY in r["overrides"]]
    if not done:
        return []
    table = []
    for name, combination in layer_combinations(12).items():
        values = [r["best"] for r in done if r["overrides"][FEATURES_KEY] == name]
        if len(values) == 1:
            table.append([combination.paper_name, name, _fmt(values[0])])
        elif values:
            table.append(
                [combination.paper_name, name, f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"]
            )
    monitor = done[0]["monitor"]
    return ["", "## Feature-based approach (paper Table 7)", ""] + _md_table(["Layers", FEATURES_KEY, monitor], table)


def record_failed_job(job_dir: Path, error: BaseException, overrides: list[str]) -> None:
    """Marks a multirun job as failed, with its error and its overrides: what summary.csv/.md show for it (a job
    refused before it started has no .hydra/ of its own yet)."""
    write_atomically(job_dir / FAILED_FILE, f"{type(error).__name__}: {message_of(error)}\n")
    if not (job_dir / ".hydra" / "overrides.yaml").is_file():
        write_atomically(job_dir / ".hydra" / "overrides.yaml", yaml.safe_dump(list(overrides)))


class SweepSummary(Callback):
    """Hydra callback (conf/hydra/default.yaml): keeps summary.csv/.md of a multirun up to date."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        output_dir = Path(config.hydra.runtime.output_dir)
        if job_return.status == JobStatus.FAILED:
            record_failed_job(output_dir, job_return._return_value, list(config.hydra.overrides.task))
        self._write(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = self._write(sweep_dir)
        if not rows:
            return
        failed = sum(r["status"] == "failed" for r in rows)
        print(f"lightbert: {len(rows)} jobs, {failed} failed; summary in {sweep_dir / SUMMARY_MD}")
        varying = _varying_keys(rows)
        for best in best_per_task(rows):
            overrides = " ".join(f"{k}={best['overrides'][k]}" for k in varying if k in best["overrides"])
            print(
                f"lightbert: best {best['task']}: job {best['job']} ({overrides or 'the only configuration'}), "
                f"{best['monitor']}={_fmt(best['best'])}"
            )
        if (sweep_dir / PLAN_FILE).is_file():
            from lightbert.analysis.benchmark import end_of_benchmark

            end_of_benchmark(sweep_dir)
        if failed:
            sys.exit(2)  # a sweep with a failed job is not a success, for a shell or a scheduler either

    @staticmethod
    def _write(sweep_dir: Path) -> list[dict]:
        try:
            rows = write_summary(sweep_dir)
            if (sweep_dir / PLAN_FILE).is_file():  # a benchmark's: the paper's tables too
                from lightbert.analysis.benchmark import write_tables

                write_tables(sweep_dir)
            return rows
        except Exception as error:  # a summary problem must never fail the jobs that already ran
            log.warning("could not write the sweep summary in %s: %s", sweep_dir, error)
            return []
