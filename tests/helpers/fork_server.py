"""`python src/<script>.py ARGS` for the tests' many commands, without paying for the imports each time.

A server process imports what the scripts import, once (torch, Lightning, Hydra, datasets: 7 s of a 2-core
machine's time per process), then forks one child per command. The child is a process of its own, as a user's
command is: it runs the script as `__main__` with the command's arguments, working directory, environment and
standard input, its own stdout and stderr, SIGINT as in a terminal, and exits with the script's status (a DDP
run's other ranks are fresh processes that Lightning starts). What it cannot show is a failure at import time: the
tests that start `python src/train.py` itself (test_processes, test_packaging, test_readme, ...) do.

Protocol: one JSON request per line on stdin ({"script", "args", "cwd", "env", "new_session", "file_size_limit",
"stdin", "stdout", "stderr"}: the last three are file paths), one JSON line back on stdout ({"returncode"},
negative for a signal, as subprocess reports it).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import sys
import traceback


def serve() -> None:
    import lightbert.cli.commands
    import lightbert.inference.predict
    import lightbert.run.flows
    import lightbert.run.jobs  # noqa: F401  (the imports are the point: every child starts with them done)

    # The imported objects, out of the collector's reach: otherwise each child's collections, and the full one at its
    # exit, touch every object of the server's heap and copy its pages (copy-on-write) - measured, 2.4 s of a
    # refused command's 2.5 s in a child, 0.9 s with the freeze.
    gc.freeze()

    reply = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request)  # never returns
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        reply.write(json.dumps({"returncode": returncode}) + "\n")


def run_child(request: dict) -> None:
    """In the forked child: the script as a fresh process would run it, then exit with its status."""
    os.dup2(os.open(request["stdin"] or os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the file descriptor, without the server's buffered lines)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal's foreground
    if request["new_session"]:  # its own process group: a test that kills the group kills this run alone
        os.setsid()
    if request["file_size_limit"]:  # what a full disk does to a write: Python ignores SIGXFSZ, so it fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (request["file_size_limit"],) * 2)
    os.chdir(request["cwd"])
    os.environ.update(request["env"])
    # What PYTHONPATH would have put on a fresh interpreter's path (e.g. tests/, for the recorder callbacks).
    sys.path[1:1] = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    script = request["script"]
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
    serve()
