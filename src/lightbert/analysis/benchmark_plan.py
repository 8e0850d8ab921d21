"""The jobs of a benchmark (`experiment=glue_benchmark`, `experiment=squad_benchmark`): every task of the family over
its grid, with restarts on the small tasks, one job per (checkpoint, task, configuration, seed).

Hydra's basic sweeper runs the cartesian product of its swept keys; a benchmark's jobs are not one (restarts only on
the small tasks, each task its own data files), so the benchmark sweeper (`hydra_plugins.lightbert_benchmark`) runs
the list this module plans. Each job's directory is named by what it runs, not by its number, so the same command
finds its finished jobs again (`results.json`) and runs only the rest.

Light to import: no torch, no Lightning (the sweeper plans before any job loads them).
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightbert.errors import UserError
from lightbert.files import write_atomically
from lightbert.run.configs import group_options

PLAN_FILE = "benchmark.json"  # in the sweep directory: every job any benchmark command planned there
# What benchmark.data_dir's files may be, per family: what task.data_files reads (data.local_files); SQuAD's answers
# are nested ({text, answer_start}), which a csv or tsv cannot hold, so its config lists json, jsonl and parquet only.
DATA_SUFFIXES = {
    "glue": (".tsv", ".csv", ".json", ".jsonl", ".parquet"),
    "squad": (".json", ".jsonl", ".parquet"),
}
# Short names of the swept keys in job directory names; any other swept key goes by its last part.
SHORT = {"optim.lr": "lr", "task.batch_size": "b", "trainer.max_epochs": "e"}


@dataclass(frozen=True)
class BenchmarkJob:
    name: str  # its directory in the sweep directory
    family: str  # glue or squad
    task: str  # lightbert's task name: mnli, squad_v1, ...
    checkpoint: str  # init_from, as given
    configuration: dict[str, Any]  # the grid's values of this job, seed left out
    seed: int
    overrides: list[str] = field(default_factory=list)  # the job's command line, without Hydra's own keys


def checkpoint_key(init_from: str) -> str:
    """A short, stable name for a checkpoint in job directory names: its last path part (a hub id's whole name)
    and a hash of its absolute path (of the id itself), so two checkpoints never share a name."""
    path = Path(init_from).expanduser()
    identity = str(path.resolve()) if path.exists() else init_from
    readable = path.stem if path.exists() else init_from.replace("/", "--")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", readable)[-40:].strip("._-") or "checkpoint"
    return f"{readable}-{hashlib.sha256(identity.encode()).hexdigest()[:6]}"


def grid_points(grid: dict[str, list], fixed: set[str]) -> list[dict[str, Any]]:
    """The grid's configurations, in its order; a key the command line sets (`fixed`) takes that one value."""
    keys = [k for k in grid if k not in fixed]
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def job_name(key: str, task: str, configuration: dict[str, Any], seed: int) -> str:
    parts = [f"{SHORT.get(k, k.rsplit('.', 1)[-1])}{v}" for k, v in configuration.items()]
    return "-".join([key, task, *parts, f"s{seed}"])


def task_splits(family: str, task: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A task's splits as its DataModule reads them: those every job needs (train and the validation sets) and the
    test sets, predicted where there is a file."""
    if family == "glue":
        from lightbert.tasks.glue.tasks import TASKS  # imported here: the plan stays light unless data_dir is given

        spec = TASKS[task]
        return ("train", *spec.validation_splits), spec.test_splits
    from lightbert.tasks.squad.data import SquadDataModule

    return ("train", *SquadDataModule.validation_splits), SquadDataModule.test_splits


def data_file_overrides(data_dir: Path | None, family: str, task: str) -> list[str]:
    """`task.data_files.<split>=<data_dir>/<task>/<split>.<ext>` for every split of the task with such a file; a
    split every job needs (train, validation) without one is refused here, before any job, naming the file."""
    if data_dir is None:
        return []
    required, tests = task_splits(family, task)
    suffixes = DATA_SUFFIXES[family]
    folder = data_dir / task
    overrides = []
    for split in (*required, *tests):
        found = sorted(p for p in folder.glob(f"{split}.*") if p.suffix in suffixes and p.is_file())
        if len(found) > 1:
            raise UserError(
                f"benchmark.data_dir: {folder} holds {len(found)} files for the {split} split "
                f"({', '.join(p.name for p in found)}); keep one"
            )
        if found:
            overrides.append(f"task.data_files.{split}={found[0].resolve()}")
        elif split in required:
            if folder.is_dir():
                there = sorted(p.name for p in folder.iterdir())
                holds = f"{folder} holds " + (", ".join(there[:6]) + (" ..." if len(there) > 6 else "") or "nothing")
            else:
                holds = f"there is no folder {folder}"
            raise UserError(
                f"benchmark.data_dir={data_dir} has no {split} file for {task} ({holds}): write it as "
                f"{folder / split}{suffixes[0]} (or {', '.join(suffixes[1:])}), or leave benchmark.data_dir unset to "
                "read the hub's data"
            )
    return overrides


def task_option(family: str, task: str) -> str:
    """The task= option of a benchmark's task: glue/rte, squad_v1."""
    return f"glue/{task}" if family == "glue" else task


def settings(config: DictConfig) -> dict[str, Any]:
    """The benchmark's settings, checked: what a bad one is refused with names the key and its valid values."""
    bench = OmegaConf.to_container(config.benchmark, resolve=True)
    grids = bench["grids"]
    if bench["grid"] not in grids:
        raise UserError(f"benchmark.grid={bench['grid']} is not one of this benchmark's grids: {', '.join(grids)}")
    tasks = list(bench["tasks"]) + (["wnli"] if bench.get("wnli") and "wnli" not in bench["tasks"] else [])
    prefix = "glue/" if bench["family"] == "glue" else "squad_"
    valid = [o.removeprefix("glue/") for o in group_options("task") if o.startswith(prefix)]
    unknown = [t for t in tasks if t not in valid]
    if unknown or not tasks:
        raise UserError(
            f"benchmark.tasks={bench['tasks']} must name some of: {', '.join(valid)}"
            + (f" ({', '.join(unknown)} is not one)" if unknown else "")
        )
    restarts = bench["restarts"]
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 1:
        raise UserError(f"benchmark.restarts={restarts} must be a whole number of seeds, 1 or more")
    data_dir = bench.get("data_dir")
    if data_dir is not None:
        data_dir = Path(str(data_dir)).expanduser()
        if not data_dir.is_dir():
            raise UserError(
                f"benchmark.data_dir={data_dir} is not a directory (one folder per task: {data_dir}/rte/...)"
            )
    grids[bench["grid"]] = checked_grid(config, bench["grid"], grids[bench["grid"]])
    if OmegaConf.select(config, "trainer.limit_val_batches") == 0:
        raise UserError(
            "trainer.limit_val_batches=0 runs no validation, and the benchmark picks each task's best configuration "
            "by its validation score: leave trainer.limit_val_batches unset (the whole validation set)"
        )
    return {**bench, "tasks": tasks, "data_dir": data_dir}


def _flat(grid: dict, prefix: str = "") -> dict[str, Any]:
    """A grid with its nested keys dotted: `+benchmark.grids.fast.optim.weight_decay=[0,0.01]` (what the command
    line can add) nests {optim: {weight_decay: [...]}}, the YAML files write `optim.weight_decay: [...]`: one key."""
    flat: dict[str, Any] = {}
    for key, value in grid.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def checked_grid(config: DictConfig, name: str, grid: dict) -> dict[str, list]:
    """The grid's keys as config keys, each with one value or more: a misspelt key or an empty list is refused here,
    before any job (a job would fail on the key, or the benchmark run no job at all)."""
    checked = {}
    for key, values in _flat(grid or {}).items():
        where = f"benchmark.grids.{name}: {key}"
        if not isinstance(values, list) or any(isinstance(v, (dict, list)) for v in values):
            example = f"[{values}]" if not isinstance(values, (dict, list)) else "[VALUE, VALUE]"
            raise UserError(f"{where}={values} must be a list of plain values, as {example}")
        if not values:
            raise UserError(
                f"{where} is empty: give it one value or more (on the command line, {key}=VALUE,VALUE sets the "
                "values the benchmark runs)"
            )
        options = group_options(key) if "." not in key else []
        if options:  # a config group: its values are options
            unknown = [v for v in values if str(v) not in options]
            if unknown:
                raise UserError(
                    f"{where} has {', '.join(map(str, unknown))}, not options of {key}: {', '.join(options)}"
                )
        elif OmegaConf.select(config, key, default=_ABSENT, throw_on_resolution_failure=False) is _ABSENT:
            parent = key.rpartition(".")[0]
            node = OmegaConf.select(config, parent) if parent else config
            valid = [f"{parent}.{k}" if parent else str(k) for k in node] if isinstance(node, DictConfig) else []
            close = difflib.get_close_matches(key, valid, n=1)
            raise UserError(
                f"{where} is not a config key"
                + (f" (did you mean {close[0]}?)" if close else "")
                + "; a grid runs config keys as the command line names them, e.g. optim.lr: [5e-5, 3e-5]"
            )
        checked[key] = values
    return checked


_ABSENT = object()


def plan(config: DictConfig, combinations: list[list[str]]) -> list[BenchmarkJob]:
    """Every job of the benchmark `config` describes, for each combination of the command line's own overrides
    (`init_from=a,b` gives one row of the table per checkpoint). Each task's files in benchmark.data_dir are found
    once, before any job."""
    bench = settings(config)
    files_of = {task: data_file_overrides(bench["data_dir"], bench["family"], task) for task in bench["tasks"]}
    family, grid = bench["family"], bench["grids"][bench["grid"]]
    # A key the command line sweeps (optim.lr=5e-5,3e-5) is part of each job's configuration, as the grid's are.
    values: dict[str, set[str]] = {}
    for combination in combinations:
        for override in combination:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    swept = [k for k, v in values.items() if len(v) > 1 and k not in ("init_from", "seed")]
    configuration_keys = [k for k in swept if not k.startswith("benchmark.")]
    jobs = []
    for combination in combinations:
        given = dict(o.split("=", 1) for o in combination if "=" in o)
        for key in given:
            if key == "task" or (key.startswith("benchmark.") and key in swept):
                raise UserError(
                    f"{key}= is chosen by experiment={family}_benchmark itself; choose tasks with "
                    "benchmark.tasks=[...] and give every benchmark.* setting one value"
                )
        init_from = given.get("init_from", config.get("init_from"))
        if not init_from or init_from in ("null", "None"):
            raise UserError(
                f"experiment={family}_benchmark fine-tunes one pre-trained model: give init_from=<a lightbert .ckpt "
                "or run directory, a Hugging Face directory, or a hub id such as bert-base-uncased>"
            )
        key = checkpoint_key(str(init_from))
        fixed = {k.lstrip("+~") for k in given}
        first_seed = int(given.get("seed", config.seed))
        # Each job's seed is its own override; benchmark.* settings plan the jobs and change none (a finished job is
        # the same job when benchmark.restarts grows).
        common = [o for o in combination if not o.startswith(("seed=", "benchmark."))]
        for task in bench["tasks"]:
            seeds = bench["restarts"] if task in bench["restart_tasks"] else 1
            files = files_of[task]
            for point in grid_points(grid, fixed):
                configuration = {**{k: given[k] for k in configuration_keys}, **point}
                for seed in range(first_seed, first_seed + seeds):
                    overrides = [
                        f"task={task_option(family, task)}",
                        *(f"{k}={v}" for k, v in point.items()),
                        f"seed={seed}",
                        *files,
                        *common,  # last: what the command line sets wins over the benchmark's files
                    ]
                    name = job_name(key, task, configuration, seed)
                    jobs.append(BenchmarkJob(name, family, task, str(init_from), configuration, seed, overrides))
    return jobs


def record_plan(sweep_dir: Path, family: str, jobs: list[BenchmarkJob]) -> None:
    """benchmark.json: the jobs of every benchmark command run into this directory (the tables' list of what is
    planned, so an interrupted benchmark shows what is done and what is not)."""
    recorded = read_plan(sweep_dir)
    if recorded and recorded["family"] != family:
        raise UserError(
            f"{sweep_dir} holds a {recorded['family']} benchmark; run experiment={family}_benchmark into another "
            "directory with hydra.sweep.dir=..."
        )
    entries = {**(recorded or {}).get("jobs", {}), **{job.name: asdict(job) for job in jobs}}
    write_atomically(sweep_dir / PLAN_FILE, json.dumps({"family": family, "jobs": entries}, indent=2) + "\n")


def read_plan(sweep_dir: Path) -> dict | None:
    path = sweep_dir / PLAN_FILE
    return json.loads(path.read_text()) if path.is_file() else None
