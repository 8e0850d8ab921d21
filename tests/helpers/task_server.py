"""The tasks of multi-process jobs, as srun or a node's launcher starts them: one `python src/train.py ARGS` per
task, each with its own environment (SLURM_PROCID, NODE_RANK, ...), forked from a server that has done the imports
once (`helpers.fork_server`), so that a test can start a job many times in a few seconds each, several at once.

Protocol: one JSON request per line on stdin ({"job", "script", "args", "unset", "tasks": [{"env", "cwd",
"stdout", "stderr"}]}; "unset": variables of the server's environment that the tasks do not have); for each job the
server replies with one JSON line of its tasks' pids as soon as they run ({"job", "pids"}), then one with their exit
statuses once all have ended ({"job", "returncodes"}, negative for a signal).
Jobs run side by side: each is watched by a process of its own (forked from the server, the tasks' parent), so
the replies of different jobs come in the order their events happen.
"""

from __future__ import annotations

import gc
import json
import os
import sys

from fork_server import run_child


def serve() -> None:
    import faulthandler

    faulthandler.enable()  # SIGABRT to a task that hangs writes its threads' stacks to the task's stderr
    import lightbert.cli.commands
    import lightbert.run.building
    import lightbert.run.evaluate
    import lightbert.run.machine_checks
    import lightbert.run.outputs
    import lightbert.run.record
    import lightbert.run.train  # noqa: F401  (the imports are the point: every task starts with them done)

    gc.freeze()  # as fork_server's: a child's collections and exit leave the server's heap untouched

    reply = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        if os.fork() == 0:  # the job's watcher: its tasks' parent, which reports them
            watch(request, reply)
        while True:  # reap the watchers of jobs that have ended
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def watch(request: dict, reply) -> None:
    pids = []
    for task in request["tasks"]:
        pid = os.fork()
        if pid == 0:
            for name in request["unset"]:
                os.environ.pop(name, None)
            run_child({"script": request["script"], "args": request["args"], "cwd": task["cwd"],
                       "env": task["env"], "stdin": None, "stdout": task["stdout"], "stderr": task["stderr"],
                       "new_session": True, "file_size_limit": None})  # fmt: skip
        pids.append(pid)
    # One line per write, under the pipe's atomic size: the lines of jobs watched side by side never interleave.
    reply.write(json.dumps({"job": request["job"], "pids": pids}) + "\n")
    codes = []
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        codes.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    reply.write(json.dumps({"job": request["job"], "returncodes": codes}) + "\n")
    reply.flush()
    os._exit(0)


if __name__ == "__main__":
    serve()
