"""`python src/<script>.py ARGS` for the tests' many commands, without paying for the imports each time.

A server process imports what the scripts import, once (torch, Lightning, Hydra, datasets: 7 s of a 2-core
machine's time per process), then forks one child per command. The child is a process of its own, as a user's
command is: it runs the script as `__main__` with the command's arguments, working directory, environment and
standard input, its own stdout and stderr, SIGINT as in a terminal, and exits with the script's status. What it
cannot show is a failure at import time: the tests that start `python src/train.py` itself (test_processes,
test_packaging, test_readme, ...) do.

A DDP run's second process is forked too (`RankSpare`): Lightning starts ranks 1..N-1 with
`subprocess.Popen([sys.executable, script, ...])`, a fresh interpreter that pays for the imports again (4 s of
this machine's time, for each of about 40 DDP runs). The child forks a spare before the script runs, from the same
clean state, and the first such `Popen` hands it the command line instead of executing a new interpreter. The
spare is what the fresh process would be where lightbert can tell: a child of the first process (`adopt_launch`
checks), with the command's arguments, environment, working directory, the first process's signal mask and ignored
signals, and Python's start-up handlers. A run's third process and later ones, and every other `Popen`, start as
they always do; the commands the tests start directly (run_train_script) launch their ranks as a user's do.

The benchmarks' scripts (bench/) have a server of their own, on the test session's Python, that also imports
transformers' BERT (`python fork_server.py MODULE ...`).

Protocol: one JSON request per line on stdin ({"script", "args", "cwd", "env", "new_session", "file_size_limit",
"stdin", "stdout", "stderr"}: the last three are file paths), one JSON line back on stdout ({"returncode"},
negative for a signal, as subprocess reports it).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import inspect
import json
import os
import resource
import signal
import subprocess
import sys
import traceback

from lightbert.cluster.processes import LAUNCHER_VARIABLE

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def serve(preload: list[str]) -> None:
    """`preload`: modules imported besides lightbert's (the benchmarks' server: transformers' BERT)."""
    import importlib

    import lightbert.cli.commands
    import lightbert.inference.predict
    import lightbert.run.building
    import lightbert.run.evaluate
    import lightbert.run.machine_checks
    import lightbert.run.outputs
    import lightbert.run.record
    import lightbert.run.train  # noqa: F401  (the imports are the point: every child starts with them done)

    for module in preload:
        importlib.import_module(module)

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
    spare = RankSpare(request["script"])
    code = run_script(request["script"], request["args"])
    spare.discard()
    sys.exit(code)


def run_script(script: str, args: list[str]) -> int:
    """The script as `__main__` with `args`; its exit status, and its output flushed."""
    sys.argv = [script, *args]
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
    # The caller exits with it: interpreter shutdown as a process ending this way has it (atexit handlers, logging's
    # flush), then the status.
    return code


class RankSpare:
    """A child forked before the script runs, waiting to be the first DDP process the script launches (see the
    module's docstring). Unused, it ends with its parent (or at `discard`)."""

    def __init__(self, script: str) -> None:
        self.script = script
        read, self.write = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.write)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent ended before the line above
                os._exit(0)
            with os.fdopen(read, "rb") as pipe:
                launch = pipe.read()
            if not launch:
                os._exit(0)
            libc.prctl(PR_SET_PDEATHSIG, 0)  # a fresh process outlives its launcher (lightbert's watch notices)
            become_launched(json.loads(launch))  # never returns
        os.close(read)
        # The script's own forked children (DataLoader workers) must not hold the pipe open.
        os.register_at_fork(after_in_child=self._close_in_child)
        SparePopen.spare = self
        subprocess.Popen = SparePopen

    def takes(self, given: dict) -> bool:
        """Whether this `Popen` is the launch of a DDP process of the script, as Lightning does it, and the spare
        is still free."""
        command = given["args"]
        pipes = ("p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite")
        return (
            self.write >= 0
            and given["preexec_fn"] is None
            and not (given["pass_fds"] or given["shell"] or given["start_new_session"])
            and given["process_group"] in (None, -1)
            and all(given[name] == -1 for name in pipes)
            and isinstance(command, list | tuple)
            and len(command) > 1
            and os.fspath(command[0]) == sys.executable
            and os.path.realpath(os.fspath(command[1])) == os.path.realpath(self.script)
            and LAUNCHER_VARIABLE in (given["env"] if given["env"] is not None else os.environ)
        )

    def launch(self, given: dict) -> bool:
        """Hands the spare this command line; False if it is gone (a signal to the process group killed it)."""
        ignored = [int(s) for s in CATCHABLE if signal.getsignal(s) == signal.SIG_IGN]
        launch = {
            "args": [os.fspath(a) for a in given["args"][1:]],
            "env": dict(given["env"] if given["env"] is not None else os.environ),
            "cwd": os.fspath(given["cwd"]) if given["cwd"] is not None else None,
            "mask": [int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
            "ignored": ignored,
        }
        pipe, self.write = os.fdopen(self.write, "wb"), -1
        try:
            with pipe:
                pipe.write(json.dumps(launch).encode())
        except BrokenPipeError:
            os.waitpid(self.pid, 0)
            return False
        return True

    def _close_in_child(self) -> None:
        if self.write >= 0:
            os.close(self.write)
            self.write = -1

    def discard(self) -> None:
        """Ends the spare if the script did not use it."""
        if self.write >= 0:
            os.close(self.write)
            self.write = -1
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


class SparePopen(subprocess.Popen):
    """`subprocess.Popen` in a forked command: the launch the spare takes becomes the spare (its pid), any other
    starts as it always does."""

    spare: RankSpare

    def _execute_child(self, *args, **kwargs):
        given = EXECUTE_CHILD.bind(self, *args, **kwargs).arguments
        if self.spare.takes(given) and self.spare.launch(given):
            self.pid, self._child_created = self.spare.pid, True
        else:
            super()._execute_child(*args, **kwargs)


EXECUTE_CHILD = inspect.signature(subprocess.Popen._execute_child)
CATCHABLE = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})


def become_launched(launch: dict) -> None:
    """In the spare: what `execve` and Python's start-up would leave, then the script."""
    for number in CATCHABLE:  # execve resets each handler, and keeps what is ignored
        with contextlib.suppress(OSError, ValueError):  # not the real-time signals the C library keeps
            signal.signal(number, signal.SIG_IGN if number in launch["ignored"] else signal.SIG_DFL)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python's start-up ignores these two
        signal.signal(number, signal.SIG_IGN)
    if signal.SIGINT not in launch["ignored"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, launch["mask"])
    if launch["cwd"] is not None:
        os.chdir(launch["cwd"])
    os.environ.clear()
    os.environ.update(launch["env"])
    args = launch["args"]
    sys.exit(run_script(args[0], args[1:]))


if __name__ == "__main__":
    serve(sys.argv[1:])
