"""The tasks of one multi-process job, as srun or a node's launcher starts them: one `python src/train.py ARGS` per
task, each with its own environment (SLURM_PROCID, NODE_RANK, ...), forked from a server that has done the imports
once (`helpers.fork_server`), so that a test can start a job many times in a few seconds each.

Protocol: one JSON request per line on stdin ({"script", "args", "cwd", "tasks": [{"env", "stdout", "stderr"}]});
the server replies with one JSON line of the tasks' pids as soon as they run ({"pids"}), then one with their exit
statuses once all have ended ({"returncodes"}, negative for a signal).
"""

from __future__ import annotations

import json
import os
import sys

from fork_server import run_child


def serve() -> None:
    import lightbert.cli.commands
    import lightbert.run.flows
    import lightbert.run.jobs  # noqa: F401  (the imports are the point: every task starts with them done)

    reply = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pids = []
        for task in request["tasks"]:
            pid = os.fork()
            if pid == 0:
                run_child({"script": request["script"], "args": request["args"], "cwd": request["cwd"],
                           "env": task["env"], "stdin": None, "stdout": task["stdout"], "stderr": task["stderr"],
                           "new_session": True, "file_size_limit": None})  # fmt: skip
            pids.append(pid)
        reply.write(json.dumps({"pids": pids}) + "\n")
        codes = []
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            codes.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
        reply.write(json.dumps({"returncodes": codes}) + "\n")


if __name__ == "__main__":
    serve()
