"""Plots of a Hydra multirun: `python -m lightbert.analysis.report <sweep dir>` writes PNGs next to summary.md and
links them.

Per task:
- `grid_<task>.png`: the best validation metric over the swept hyperparameters as heat maps (the paper's grid:
  lr down, batch size across, one panel per epoch count), each cell the mean over seeds, the best cell outlined;
  with one swept key, a bar chart instead;
- `seeds_<task>.png`: where jobs differ only in `seed`, every seed's value per configuration and their mean;
- `curves_<task>.png`: every job's training loss and its monitored validation metric against the step
  (from each job's metrics.csv), the best job drawn thick.

The same functions draw the sweep notebook (notebooks/02_sweep_results.ipynb).
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import math
import statistics
import sys
from pathlib import Path

# Figures are built with matplotlib's object API, not pyplot: no backend or display is involved, so the same
# figure is saved as a PNG here and shown by a notebook (`png_bytes`).
from typing import TYPE_CHECKING

from lightbert.analysis.sweep import FEATURES_KEY, SUMMARY_MD, job_rows, write_summary
from lightbert.errors import UserError, exits_on_user_error, require_extra

if TYPE_CHECKING:
    from matplotlib.figure import Figure
from lightbert.files import write_atomically

# The paper's grid first, in this order: heat map rows, columns, panels.
PREFERRED_AXES = ("optim.lr", "task.batch_size", "trainer.max_epochs")
PLOTS_HEADING = "## Plots"


def _number(value: str) -> float | str:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def swept_keys(rows: list[dict]) -> list[str]:
    """The overrides that differ between jobs, except `seed`: the paper's grid keys first."""
    keys = sorted({k for r in rows for k in r["overrides"]} - {"seed"})
    varying = [k for k in keys if len({r["overrides"].get(k) for r in rows}) > 1]
    return sorted(varying, key=lambda k: (PREFERRED_AXES.index(k) if k in PREFERRED_AXES else len(PREFERRED_AXES), k))


def _values(rows: list[dict], key: str) -> list[str]:
    """The key's values across the jobs: numbers ascending; `task.features` in the paper's Table 7 order."""
    values = {r["overrides"].get(key, "") for r in rows}
    if key == FEATURES_KEY:
        from lightbert.model.feature_based import layer_combinations

        order = list(layer_combinations(12))
        return sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))
    return sorted(values, key=lambda v: (isinstance(_number(v), str), _number(v)))


def mean_by_config(rows: list[dict], keys: list[str]) -> dict[tuple, float]:
    """The mean best metric of the finished jobs of each combination of `keys` (over seeds and anything else)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r["best"] is not None:
            groups.setdefault(tuple(r["overrides"].get(k, "") for k in keys), []).append(r["best"])
    return {config: statistics.mean(values) for config, values in groups.items()}


def _matplotlib() -> tuple[type, type]:
    """matplotlib's Figure and Rectangle (the report extra), or the error that names the extra."""
    require_extra("report", "python -m lightbert.analysis.report (a sweep's plots)")
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    return Figure, Rectangle


def grid_figure(rows: list[dict], task: str) -> Figure | None:
    """Heat maps of the best metric over the first two swept keys, a panel per value of the others."""
    Figure, Rectangle = _matplotlib()  # noqa: N806 (the classes, under their own names)
    keys = swept_keys(rows)
    done = [r for r in rows if r["best"] is not None]
    if not keys or not done:
        return None
    monitor, mode = done[0]["monitor"], done[0]["mode"]
    means = mean_by_config(done, keys)
    best_config = (max if mode == "max" else min)(means, key=means.get)
    if len(keys) == 1:
        labels = _values(rows, keys[0])
        fig = Figure(figsize=(max(4, 0.9 * len(labels) + 2), 3.5))
        ax = fig.subplots()
        heights = [means.get((v,), math.nan) for v in labels]
        bars = ax.bar(range(len(labels)), [0 if math.isnan(h) else h for h in heights], color="tab:blue")
        for x, (bar, label, height) in enumerate(zip(bars, labels, heights, strict=True)):
            if (label,) == best_config:
                bar.set_color("tab:orange")
            if math.isnan(height):  # failed or unfinished: say so, rather than a bar that reads as 0.0
                failed = any(r["status"] == "failed" for r in rows if r["overrides"].get(keys[0], "") == label)
                ax.text(x, 0, "failed" if failed else "no result", ha="center", va="bottom", rotation=90, color="red")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.set_xlabel(keys[0])
        ax.set_ylabel(f"best {monitor}")
        ax.set_title(f"{task}: best {monitor} per {keys[0]} (orange: best)")
        fig.tight_layout()
        return fig
    row_key, col_key, panel_keys = keys[0], keys[1], keys[2:]
    row_values, col_values = _values(rows, row_key), _values(rows, col_key)
    panels = list(itertools.product(*(_values(rows, k) for k in panel_keys))) or [()]
    finite = [v for v in means.values() if math.isfinite(v)]
    low, high = min(finite), max(finite)
    fig = Figure(figsize=(2.5 + 1.1 * len(col_values) * len(panels), 2.2 + 0.6 * len(row_values)))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        cells = [[means.get((r, c, *panel), math.nan) for c in col_values] for r in row_values]
        image = ax.imshow(cells, cmap="viridis", vmin=low, vmax=high, aspect="auto")
        for i, row in enumerate(cells):
            for j, value in enumerate(row):
                text = "—" if math.isnan(value) else f"{value:.3f}"
                ax.text(j, i, text, ha="center", va="center", color="white" if value < (low + high) / 2 else "black")
                if (row_values[i], col_values[j], *panel) == best_config:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
        ax.set_xticks(range(len(col_values)), col_values)
        ax.set_yticks(range(len(row_values)), row_values)
        ax.set_xlabel(col_key)
        ax.set_ylabel(row_key)
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(panel_keys, panel, strict=True)) or task)
    fig.colorbar(image, ax=list(axes[0]), label=f"best {monitor} (mean over seeds)")
    fig.suptitle(f"{task}: best {monitor} over the grid (red: best)")
    return fig


def seed_figure(rows: list[dict], task: str) -> Figure | None:
    """Every seed's best metric per configuration, with the mean; None when no configuration has 2+ seeds."""
    Figure, _ = _matplotlib()  # noqa: N806 (the classes, under their own names)
    keys = swept_keys(rows)
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r["best"] is not None:
            groups.setdefault(tuple(r["overrides"].get(k, "") for k in keys), []).append(r["best"])
    if not any(len(v) > 1 for v in groups.values()) or len({r["overrides"].get("seed") for r in rows}) < 2:
        return None
    configs = sorted(groups, key=lambda c: tuple(str(_number(v)) for v in c))
    fig = Figure(figsize=(max(4, 0.8 * len(configs) + 2), 3.5))
    ax = fig.subplots()
    for x, config in enumerate(configs):
        values = groups[config]
        ax.scatter([x] * len(values), values, color="tab:blue", alpha=0.7, label="a seed" if x == 0 else None)
        ax.scatter([x], [statistics.mean(values)], color="black", marker="_", s=400, label="mean" if x == 0 else None)
    labels = [" ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, c, strict=True)) or task for c in configs]
    ax.set_xticks(range(len(configs)), labels, rotation=30, ha="right")
    monitor = next(r["monitor"] for r in rows if r["best"] is not None)
    ax.set_ylabel(f"best {monitor}")
    ax.set_title(f"{task}: spread over seeds")
    ax.legend()
    fig.tight_layout()
    return fig


def read_metrics(job_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each metric's (step, value) pairs from a job's metrics.csv (Lightning's CSV logger)."""
    files = sorted(job_dir.glob("**/metrics.csv"))
    series: dict[str, list[tuple[int, float]]] = {}
    for file in files[:1]:
        with file.open() as f:
            for row in csv.DictReader(f):
                step = int(float(row.get("step") or 0))
                for name, value in row.items():
                    if name not in ("step", "epoch") and value not in ("", None):
                        series.setdefault(name, []).append((step, float(value)))
    return series


def curves_figure(sweep_dir: Path, rows: list[dict], task: str) -> Figure | None:
    """Training loss and the monitored validation metric of every job against the step."""
    Figure, _ = _matplotlib()  # noqa: N806 (the classes, under their own names)
    jobs = [(r, read_metrics(sweep_dir / r["job"])) for r in rows]
    jobs = [(r, m) for r, m in jobs if m]
    if not jobs:
        return None
    monitor = next((r["monitor"] for r, _ in jobs if r["monitor"]), "val/loss")
    done = [r for r, _ in jobs if r["best"] is not None]
    best = (max if done and done[0]["mode"] == "max" else min)(done, key=lambda r: r["best"]) if done else None
    keys = swept_keys(rows)
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for r, metrics in jobs:
        label = " ".join(
            f"{k.split('.')[-1]}={r['overrides'].get(k, '')}" for k in [*keys, "seed"] if k in r["overrides"]
        )
        width = 2.5 if r is best else 1.0
        for ax, name in zip(axes, ("train/loss", monitor), strict=True):
            points = metrics.get(name, [])
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    linewidth=width,
                    marker="." if len(points) < 20 else None,
                    label=label or r["job"],
                )
    for ax, name in zip(axes, ("train/loss", monitor), strict=True):
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.set_title(f"{task}: {name}")
        if not ax.lines:  # e.g. runs shorter than trainer.log_every_n_steps log no train/loss
            why = "runs shorter than trainer.log_every_n_steps" if name == "train/loss" else "no validation ran"
            ax.text(0.5, 0.5, f"no {name} logged:\n{why}", ha="center", va="center", transform=ax.transAxes)
        elif len(jobs) <= 12:
            ax.legend(fontsize=7, title="thick: best job" if best is not None else None, title_fontsize=7)
    fig.tight_layout()
    return fig


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG data, e.g. for `IPython.display.Image` in a notebook (any matplotlib backend)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _slug(task: str) -> str:
    return task.replace("/", "_") or "task"


def write_report(sweep_dir: str | Path) -> list[Path]:
    """Rewrite summary.md, then add the PNGs of every task next to it and a "Plots" section linking them."""
    sweep_dir = Path(sweep_dir).expanduser()
    if not sweep_dir.is_dir():
        raise UserError(f"{sweep_dir} is not a directory; give a multirun directory (outputs/<task>/multiruns/...)")
    rows = job_rows(sweep_dir)
    if not rows:
        raise UserError(
            f"{sweep_dir} holds no multirun jobs (no <job>/.hydra/overrides.yaml); is it a sweep directory?"
        )
    write_summary(sweep_dir)
    written = []
    for task in sorted({r["task"] for r in rows}):
        task_rows = [r for r in rows if r["task"] == task]
        figures = {
            f"grid_{_slug(task)}.png": grid_figure(task_rows, task),
            f"seeds_{_slug(task)}.png": seed_figure(task_rows, task),
            f"curves_{_slug(task)}.png": curves_figure(sweep_dir, task_rows, task),
        }
        for name, figure in figures.items():
            if figure is not None:
                figure.savefig(sweep_dir / name, dpi=110, bbox_inches="tight")
                written.append(sweep_dir / name)
    summary = sweep_dir / SUMMARY_MD
    lines = [summary.read_text().rstrip("\n"), "", PLOTS_HEADING, ""]
    lines += [f"![{path.stem}]({path.name})" for path in written] or ["No finished job to plot yet."]
    write_atomically(summary, "\n".join(lines) + "\n")
    return written


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightbert.analysis.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a multirun directory, e.g. outputs/glue/mrpc/multiruns/<date_time>")
    args = parser.parse_args(argv)
    written = write_report(args.sweep_dir)
    print(f"lightbert: wrote {len(written)} plot(s) and linked them from {Path(args.sweep_dir) / SUMMARY_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
