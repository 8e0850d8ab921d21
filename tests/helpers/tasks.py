"""The tasks of multi-process jobs, as srun or a node's launcher starts them (a SLURM job's tasks, a job's nodes):
one `python src/train.py ARGS` per task with its own variables (SLURM_PROCID, NODE_RANK, ...), forked side by side
from the tests' fork server (`helpers.fork_server`: what that cannot show, and which tests start real interpreters
for it), each in a session of its own, several jobs at once."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.runs import REPO, forked, pythonpath_with_tests


class Tasks:
    def start(
        self, args: list[str], envs: list[dict], logs: Path, cwds: list[Path] | None = None, unset: tuple[str, ...] = ()
    ) -> tuple[int, list[int]]:
        """Starts a job's tasks, `python src/train.py ARGS` with task i's variables `envs[i]` added to the test's
        (`unset` taken away; the tests' callbacks importable; one thread each), in `cwds[i]` (default: the
        repository), writing `logs/task{i}.out` and `.err`; returns the job's number (for `wait`) and the tasks'
        pids."""
        base = {k: v for k, v in os.environ.items() if k not in unset}
        base |= {"PYTHONPATH": pythonpath_with_tests(), "OMP_NUM_THREADS": "1"}
        tasks = [
            {"env": {**base, **env}, "cwd": str(cwds[i] if cwds else REPO), "stdin": None,
             "stdout": str(logs / f"task{i}.out"), "stderr": str(logs / f"task{i}.err"), "new_session": True,
             "file_size_limit": None}
            for i, env in enumerate(envs)
        ]  # fmt: skip
        return forked.start("train", args, tasks)

    def wait(self, job: int, pids: list[int], seconds: float) -> list[int]:
        """The tasks' exit statuses; a task still running after `seconds` is a deadlock: the test fails
        (`ForkServer.wait`)."""
        return forked.wait(job, pids, seconds)


tasks = Tasks()
