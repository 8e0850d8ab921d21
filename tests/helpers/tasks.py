"""The tests' side of `helpers.task_server`: the tasks of multi-process jobs (a SLURM job's tasks, a job's nodes),
forked from one process that has done the imports, several jobs at once."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers import runtime
from helpers.runs import REPO, pythonpath_with_tests

PATIENCE = 120  # seconds for a job's tasks to start


class TaskServer:
    """`helpers.task_server`, started on first use (each test's jobs may run side by side, from threads of the
    test)."""

    def __init__(self) -> None:
        self.server: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.replies: dict[int, queue.Queue] = {}
        self.jobs = itertools.count()

    def _serve(self) -> None:
        if self.server is None or self.server.poll() is not None:
            command = [runtime.python(), str(REPO / "tests" / "helpers" / "task_server.py")]
            env = {**os.environ, "PYTHONPATH": pythonpath_with_tests(), "OMP_NUM_THREADS": "1"}
            self.server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           cwd=REPO, env=env)  # fmt: skip
            atexit.register(self.server.kill)
            threading.Thread(target=self._read, args=(self.server,), daemon=True).start()

    def _read(self, server: subprocess.Popen) -> None:
        for line in server.stdout:  # each job's replies to the thread that started it
            reply = json.loads(line)
            self.replies[reply["job"]].put(reply)

    def start(
        self,
        args: list[str],
        envs: list[dict],
        logs: Path,
        cwds: list[Path] | None = None,
        unset: tuple[str, ...] = (),
    ) -> tuple[int, list[int]]:
        """Starts a job's tasks, `python src/train.py ARGS` with task i's variables `envs[i]` added (`unset` taken
        away), in `cwds[i]` (default: the repository), writing `logs/task{i}.out` and `.err`; returns the job's
        number (for `wait`) and the tasks' pids."""
        tasks = [
            {"env": env, "cwd": str(cwds[i] if cwds else REPO), "stdout": str(logs / f"task{i}.out"),
             "stderr": str(logs / f"task{i}.err")}
            for i, env in enumerate(envs)
        ]  # fmt: skip
        with self.lock:
            self._serve()
            job = next(self.jobs)
            self.replies[job] = queue.Queue()
            request = {"job": job, "script": str(REPO / "src" / "train.py"), "args": args, "unset": list(unset)}
            self.server.stdin.write(json.dumps({**request, "tasks": tasks}) + "\n")
            self.server.stdin.flush()
        return job, self.replies[job].get(timeout=PATIENCE)["pids"]

    def wait(self, job: int, pids: list[int], seconds: float) -> list[int]:
        """The tasks' exit statuses; a task still running after `seconds` is a deadlock: every one is killed (its
        process group: the DDP processes it launched too), and the test fails."""
        try:
            return self.replies[job].get(timeout=seconds)["returncodes"]
        except queue.Empty:
            for pid in pids:  # faulthandler writes every thread's stack to the task's stderr (`stacks`)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
            time.sleep(3)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            self.replies[job].get(timeout=PATIENCE)
            pytest.fail(f"the job's tasks were still running {seconds} s after they started or were signalled")


tasks = TaskServer()
