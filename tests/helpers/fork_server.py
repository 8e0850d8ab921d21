"""A speed-up for the tests' commands: `python <script>.py ARGS`, forked from a server that has done the imports.

A server process imports what the scripts import, once (torch, Lightning, Hydra, datasets: 4 to 7 s of a 2-core
machine's time per fresh interpreter), then forks one child per command. The child runs the real script as `__main__`
with the command's arguments, working directory, environment and standard input, its own stdout and stderr, SIGINT as
in a terminal, optionally a session of its own, and exits with the script's status. Every process the script starts
is a real one: the DDP ranks Lightning launches (`subprocess.Popen([sys.executable, script, ...])`) are fresh
interpreters, as are DataLoader workers' parents' children and everything else.

What a forked command cannot show, and which tests start the real command for it:
- a failure at import time, and what a module does when it is imported: the tests that start `python src/train.py`
  or an installed `lightbert-*` command in a fresh interpreter (test_processes, test_packaging, test_readme,
  test_one_path, test_cluster, test_config, test_train);
- what a library reads from the environment once, when it loads: the child gets the command's environment, but
  torch's C++ core (e.g. `TORCH_CPP_LOG_LEVEL`) and OpenMP were loaded by the server (`OMP_NUM_THREADS` is applied
  again with `torch.set_num_threads`, which is all a forked child can do). The DDP ranks are fresh interpreters, so
  what a first process sets for its ranks (`lightbert.cluster.processes.launching`) is read as in a user's run;
- Python's start-up (site, the interpreter's signal dispositions): redone here by hand (`run_child`), as far as it
  matters to the scripts. test_processes' signal and kill tests start `python src/train.py` itself.

The tests of results (a metric, a file, a refusal's line) use it through `helpers.runs` (`run_train_forked`,
`run_script_forked`, `run_train_recorded`), or call the library verb in the test process; the tests of processes start
the real command (`helpers.runs.run_train_script`, `runtime.python()`), except the multi-task jobs below.

A job of several tasks (a SLURM job's tasks as srun starts them, a job's nodes with Lightning's variables) is one
request: its tasks are forked side by side, each in a session of its own, and jobs run side by side too, so that
test_preemption can repeat a case ten times in a few seconds each. test_processes (signals and kill -9 to real
`python src/train.py` commands and their DDP ranks) and test_multinode's torchrun jobs (torchrun's real workers)
start the same code paths in fresh interpreters.

The benchmarks' scripts (bench/) use a server of their own, on the test session's Python, that also imports
transformers' BERT (`python fork_server.py MODULE ...`).

Protocol: one JSON request per line on stdin, a job: {"job", "script", "args", "tasks": [{"env", "cwd", "stdin",
"stdout", "stderr", "new_session", "file_size_limit"}]} ("env": the whole environment of the task; "stdin", "stdout",
"stderr": file paths, "stdin" may be null). For each job the server replies with one JSON line of its tasks' pids as
soon as they run ({"job", "pids"}), then one with their exit statuses once all have ended ({"job", "returncodes"},
negative for a signal, as subprocess reports it). Each job is watched by a process of its own (forked from the server,
the tasks' parent), so the replies of different jobs come in the order their events happen.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import resource
import signal
import sys
import traceback


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

    faulthandler.enable()  # SIGABRT to a task that hangs writes its threads' stacks to the task's stderr
    # The imported objects, out of the collector's reach: otherwise each child's collections, and the full one at its
    # exit, touch every object of the server's heap and copy its pages (copy-on-write) - measured, 2.4 s of a
    # refused command's 2.5 s in a child, 0.9 s with the freeze.
    gc.freeze()

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
            run_child(request["script"], request["args"], task)  # never returns
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


def run_child(script: str, args: list[str], task: dict) -> None:
    """In the forked child: the script as a fresh process would run it, then exit with its status."""
    os.dup2(os.open(task["stdin"] or os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the file descriptor, without the server's buffered lines)
    for fd, path in ((1, task["stdout"]), (2, task["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground
    if task["new_session"]:  # its own process group: a test that kills the group kills this run alone
        os.setsid()
    if task["file_size_limit"]:  # what a full disk does to a write: Python ignores SIGXFSZ, so it fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (task["file_size_limit"],) * 2)
    os.chdir(task["cwd"])
    os.environ.clear()
    os.environ.update(task["env"])
    # What PYTHONPATH would have put on a fresh interpreter's path (e.g. tests/, for the recorder callbacks).
    sys.path[1:1] = [entry for entry in task["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    if task["env"].get("OMP_NUM_THREADS", "").isdigit():  # read by OpenMP when torch loaded, in the server
        import torch

        torch.set_num_threads(int(task["env"]["OMP_NUM_THREADS"]))
    sys.exit(run_script(script, args))


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


if __name__ == "__main__":
    serve(sys.argv[1:])
