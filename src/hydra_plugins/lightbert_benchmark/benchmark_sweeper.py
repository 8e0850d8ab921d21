"""The sweeper of `experiment=glue_benchmark` and `experiment=squad_benchmark` (`hydra/sweeper=lightbert_benchmark`).

It launches the jobs `lightbert.analysis.benchmark_plan.plan` lists through whichever launcher the config names (in
this process, `cluster=submitit_local`, `cluster=slurm`), each in the sweep directory under its own name, and skips the
jobs whose directory holds a `results.json`: the same command run again finishes an interrupted benchmark. A failed
job is recorded (the sweep summary lists it) and the others go on.
"""

import fcntl
import logging
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from lightbert.analysis.benchmark_plan import BenchmarkJob, plan, record_plan, settings, task_option
from lightbert.cluster import processes
from lightbert.errors import UserError
from lightbert.files import RESULTS_FILE

log = logging.getLogger(__name__)


@dataclass
class BenchmarkSweeperConf:
    _target_: str = "hydra_plugins.lightbert_benchmark.benchmark_sweeper.BenchmarkSweeper"
    # Hydra loads plugin modules outside sys.modules, where a dataclass cannot resolve postponed annotations: no
    # `from __future__ import annotations` here.
    max_batch_size: int | None = None  # jobs handed to the launcher at once (None: all)


ConfigStore.instance().store(group="hydra/sweeper", name="lightbert_benchmark", node=BenchmarkSweeperConf)


class BenchmarkSweeper(Sweeper):
    def __init__(self, max_batch_size: int | None = None) -> None:
        self.max_batch_size = max_batch_size
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher = None
        self._lock: int | None = None  # the sweep directory's, held until the process ends

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        try:
            jobs, sweep_dir = self._plan(arguments)
        except UserError as error:  # refused before the sweep directory is made: one line, exit 2
            print(f"lightbert: error: {error}", file=sys.stderr)
            sys.exit(2)
        todo = [job for job in jobs if not (sweep_dir / job.name / RESULTS_FILE).is_file()]
        for job in todo:  # a retried job is running, not failed, until it ends again
            (sweep_dir / job.name / "failed.txt").unlink(missing_ok=True)
        print(
            f"lightbert: benchmark in {sweep_dir}: {len(jobs)} jobs, {len(jobs) - len(todo)} finished before "
            f"(skipped), {len(todo)} to run"
        )
        batch_size = self.max_batch_size or max(1, len(todo))
        returns, first = [], 0
        for start in range(0, len(todo), batch_size):
            batch = [[*job.overrides, f"hydra.sweep.subdir={job.name}"] for job in todo[start : start + batch_size]]
            results = self.launcher.launch(batch, initial_job_idx=first)
            # A failed job does not end the benchmark (Hydra's sweeper raises its error here): the summary lists it,
            # the others go on. A refusal (UserError) has said its line already; anything else is a bug, shown whole.
            for job_return in results:
                error = job_return._return_value if job_return.status == JobStatus.FAILED else None
                if isinstance(error, BaseException) and not isinstance(error, UserError):
                    print(f"lightbert: job {job_return.working_dir} failed:", file=sys.stderr)
                    traceback.print_exception(error, file=sys.stderr)
            returns.append(results)
            first += len(batch)
        return returns

    def _plan(self, arguments: list[str]) -> tuple[list[BenchmarkJob], Path]:
        assert self.config is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        combinations = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)[0]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        logger = self.config.get("logger") or {}
        if "wandb" in logger and not any(o.startswith("logger.wandb.group=") for o in arguments):
            # One W&B group for the whole benchmark (a plain multirun groups by task), named by its directory.
            group = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{sweep_dir.parent.name}-{sweep_dir.name}")
            combinations = [[*c, f"logger.wandb.group={group}"] for c in combinations]
        bench = settings(self.config)
        for task in bench["tasks"]:
            # A check that the jobs compose, as Hydra's basic sweeper checks every job before it launches any.
            option = f"task={task_option(bench['family'], task)}"
            common = [o for o in combinations[0] if not o.startswith("task=")]
            self.hydra_context.config_loader.load_sweep_config(self.config, [*common, option])
        jobs = plan(self.config, combinations)
        from lightbert.checkpoints.reading import check_init_from

        for checkpoint in dict.fromkeys(job.checkpoint for job in jobs):
            check_init_from(checkpoint)  # once, not once per job: every job would fail with the same line
        for job in jobs:
            _check_finished_job_matches(sweep_dir / job.name, job)
        self._lock = _hold(sweep_dir)  # the last check; the first write is the next line
        record_plan(sweep_dir, bench["family"], jobs)  # refuses another family's directory before writing
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        return jobs, sweep_dir


def _hold(sweep_dir: Path) -> int:
    """Holds the sweep directory for this benchmark until the process ends (its summary and submission.zip are
    written after the last job): a second benchmark command into it at the same time is refused before it writes
    anything, where it used to run into the first one's jobs, whose own locks refused it job by job, and mark them
    failed. A directory that does not exist yet is made: no benchmark is running there."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    handle = os.open(sweep_dir, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise UserError(
            f"another benchmark is running in {sweep_dir} right now; wait for it to finish (the same command then "
            "skips its finished jobs), or run this one into another directory with hydra.sweep.dir=..."
        ) from None
    processes.install()
    processes.hold_in_this_process_only(handle)  # DataLoader workers of the jobs run here must not keep it
    return handle


def _check_finished_job_matches(job_dir: Path, job: BenchmarkJob) -> None:
    """A finished job is skipped only when it ran what this command asks of it: the same overrides."""
    record = job_dir / ".hydra" / "overrides.yaml"
    if not (job_dir / RESULTS_FILE).is_file() or not record.is_file():
        return
    recorded = set(yaml.safe_load(record.read_text()) or [])
    asked = set(job.overrides)
    if recorded != asked:
        differ = sorted(recorded ^ asked)
        raise UserError(
            f"{job_dir} holds a finished job that ran with other settings ({', '.join(differ[:4])}); run the "
            "benchmark again with the settings it started with to finish it, or into another directory with "
            "hydra.sweep.dir=..."
        )
