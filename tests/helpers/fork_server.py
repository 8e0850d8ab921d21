"""`python src/train.py ARGS` for the many short commands of the tests (refusals, one-line errors), without paying
for the imports each time.

A server process imports what src/train.py imports, once (torch, Lightning, Hydra, datasets: 7 s of a 2-core
machine's time per process), then forks one child per command. The child is a process of its own, as a user's
command is: it runs src/train.py as `__main__` with the command's arguments, working directory and environment,
its own stdout and stderr, SIGINT as in a terminal, and exits with the script's status. What it cannot show is a
failure at import time: the tests that start real `python src/train.py` processes do.

Protocol: one JSON request per line on stdin ({"args", "cwd", "env", "new_session", "stdout", "stderr"}: the last
two are file paths), one JSON line back on stdout ({"returncode"}, negative for a signal, as subprocess reports it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback


def serve(script: str) -> None:
    import lightbert.run.commands
    import lightbert.run.jobs  # noqa: F401  (the imports are the point: every child starts with them done)

    reply = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(script, request)  # never returns
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        reply.write(json.dumps({"returncode": returncode}) + "\n")


def run_child(script: str, request: dict) -> None:
    """In the forked child: src/train.py as a fresh process would run it, then exit with its status."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal's foreground
    if request["new_session"]:  # its own process group: a test that kills the group kills this run alone
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.update(request["env"])
    # What PYTHONPATH would have put on a fresh interpreter's path (e.g. tests/, for the recorder callbacks).
    sys.path[1:1] = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.argv = [script, *request["args"]]
    code = 0
    try:
        import runpy

        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if isinstance(exit_.code, int) or exit_.code is None:
            code = exit_.code or 0
        else:  # sys.exit("message"): Python prints it and exits 1
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Interpreter shutdown as a process ending this way has it (atexit handlers, logging's flush), then the status.
    sys.exit(code)


if __name__ == "__main__":
    serve(sys.argv[1])
