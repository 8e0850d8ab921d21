"""Runs as a user starts them: composed configs, `python src/train.py` in a subprocess, small corpora."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from helpers import runtime
from lightbert.run import console
from lightbert.run.configs import compose_config as lightbert_compose_config

REPO = Path(__file__).resolve().parents[2]


CONF_DIR = REPO / "conf"


# Common English words: the synthetic corpora are random sentences of these.
WORDS = """
the of and to in is was for on that by with as at from his her are were be this which have or an had not but
their they one its new after first also been has who two more other into all time when some would there can
city year state world school people part music team river war album film series party house game called
""".split()


# What libraries print that a user cannot act on: what lightbert filters (lightbert.run.console.CONSOLE_NOISE), and
# what it never lets them print (Lightning's TF32 advice: the run sets it; the progress bar's version number; any
# warning Lightning thinks may be the user's).
CONSOLE_NOISE = (*console.CONSOLE_NOISE, "set_float32_matmul_precision", "v_num", "PossibleUserWarning")


def console_noise(result: subprocess.CompletedProcess) -> list[str]:
    """The lines of a finished command's console (stdout and stderr) that carry known noise."""
    lines = (result.stdout + result.stderr).splitlines()
    return [line for line in lines if any(noise in line for noise in CONSOLE_NOISE)]


DEVICES = {"gpu": 1, "ddp": 2, "ddp8": 2, "fsdp": 2}  # the CPU twin's device count per trainer config

TWO_PHASES = "task.phases=[{until:0.5,datamodule:{max_seq_length:32}},{until:1.0,datamodule:{max_seq_length:64}}]"


def write_bert_corpus(path: Path, num_documents: int = 40, seed: int = 0) -> Path:
    """A BERT-format file: `num_documents` documents of 4-12 English-looking sentences, one per line."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_documents):
        for _ in range(rng.randint(4, 12)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(5, 18))]
            lines.append(" ".join(words).capitalize() + ".")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# A pre-training run of seconds on a corpus=text file (add corpus.paths=[...]): what the fault tests run for real.
TINY_PRETRAIN = [
    "model=bert_tiny",
    "trainer=cpu",
    "task.batch_size=4",
    "task.max_seq_length=64",
    "task.datamodule.vocab_size=400",
    "task.datamodule.dupe_factor=1",
    "task.datamodule.num_workers=0",
    "logger=csv",
    "corpus=text",
]


# The modern recipe's pre-training of seconds (task=pretrain_modern on model=modernbert_tiny; add corpus=... ).
TINY_MODERN_PRETRAIN = [
    "model=modernbert_tiny",
    "task=pretrain_modern",
    "trainer=cpu",
    "logger=csv",
    "task.batch_size=4",
    "task.max_seq_length=64",
    "task.datamodule.num_workers=0",
    "task.datamodule.vocab_size=400",
    "model.local_attention=16",
]


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies are dead: their parent has not reaped them yet)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def snapshot(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file under `directory`: its modification time and content hash (a refused command changes neither)."""
    return {
        str(p.relative_to(directory)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def compose_config(overrides: list[str], output_dir: Path, config_name: str = "train") -> DictConfig:
    """The config `python src/train.py OVERRIDES` (or src/evaluate.py's) would run, with its run directory at
    `output_dir`; composed from the checkout's conf/."""
    return lightbert_compose_config(overrides, output_dir, CONF_DIR, config_name)


def run_settings(cfg: DictConfig):
    """A run's settings as `lightbert.train` builds them: the config checked as a whole, then typed."""
    from lightbert.run.config_checks import checked_config
    from lightbert.run.settings import RunSettings

    return RunSettings.from_config(checked_config(cfg))


def default_sigint() -> None:
    """For a child that must take Ctrl-C: a non-interactive shell starts background jobs with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_train_script(
    *args: str, cwd: Path = REPO, start_new_session: bool = False, python: str | None = None, **env: str
) -> subprocess.CompletedProcess:
    """`python src/train.py ARGS` in a subprocess, as a user would run it (SIGINT as in a terminal's foreground), on
    a user's install (`runtime.python()`) unless `python` says which; `env` adds environment variables."""
    return subprocess.run(
        [python or runtime.python(), str(REPO / "src" / "train.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, **env},
        start_new_session=start_new_session,
        preexec_fn=default_sigint,
    )


class ForkServer:
    """Commands forked from a server that has done the scripts' imports once (`helpers.fork_server`, whose docstring
    says what a forked command cannot show and which tests start the real one instead): a second or two instead of
    five or more on this machine. `python`: the interpreter (asked when the server starts); `folder`: where the
    scripts are; `preload`: what the server imports besides lightbert. Each test's jobs may run side by side, from
    threads of the test."""

    def __init__(
        self, python: Callable[[], str] = runtime.python, folder: Path = REPO / "src", preload: tuple[str, ...] = ()
    ) -> None:
        self.python, self.folder, self.preload = python, folder, preload
        self.server: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.replies: dict[int, queue.Queue] = {}
        self.jobs = itertools.count()
        self.files = Path(tempfile.mkdtemp(prefix="lightbert-forked-"))  # each command's stdin, stdout, stderr
        atexit.register(shutil.rmtree, self.files, ignore_errors=True)

    def _serve(self) -> None:
        if self.server is None or self.server.poll() is not None:
            command = [self.python(), str(Path(__file__).with_name("fork_server.py")), *self.preload]
            self.server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
            atexit.register(self.server.kill)
            threading.Thread(target=self._read, args=(self.server,), daemon=True).start()

    def _read(self, server: subprocess.Popen) -> None:
        for line in server.stdout:  # each job's replies to the thread that started it
            reply = json.loads(line)
            self.replies[reply["job"]].put(reply)

    def start(self, script: str, args: list[str], tasks: list[dict]) -> tuple[int, list[int]]:
        """Starts a job's tasks, `python <folder>/<script>.py ARGS` each; a task: {"env" (the whole environment),
        "cwd", "stdin", "stdout", "stderr" (file paths; stdin may be None), "new_session", "file_size_limit"}. Returns
        the job's number (for `wait`) and the tasks' pids."""
        with self.lock:
            self._serve()
            job = next(self.jobs)
            self.replies[job] = queue.Queue()
            request = {"job": job, "script": str(self.folder / f"{script}.py"), "args": list(args), "tasks": tasks}
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
        return job, self.replies[job].get(timeout=TASKS_PATIENCE)["pids"]

    def wait(self, job: int, pids: list[int], seconds: float) -> list[int]:
        """The tasks' exit statuses; a task still running after `seconds` is a deadlock: every one is sent SIGABRT
        (faulthandler writes every thread's stack to its stderr), then killed with its process group where it has one
        of its own (the DDP processes it launched too), and the test fails."""
        try:
            return self._wait(job, seconds)
        except queue.Empty:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
            time.sleep(3)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
            self._wait(job, TASKS_PATIENCE)
            pytest.fail(f"the job's tasks were still running {seconds} s after they started or were signalled")

    def _wait(self, job: int, seconds: float) -> list[int]:
        codes = self.replies[job].get(timeout=seconds)["returncodes"]
        del self.replies[job]
        return codes

    def run(
        self,
        script: str,
        *args: str,
        cwd: Path = REPO,
        start_new_session: bool = False,
        file_size_limit: int | None = None,
        stdin: str | None = None,
        **env: str,
    ) -> subprocess.CompletedProcess:
        """`python <folder>/<script>.py ARGS` as `subprocess.run` would run it (the test's environment, `env` added),
        forked; its output once it has ended."""
        files = Path(tempfile.mkdtemp(dir=self.files))
        if stdin is not None:
            (files / "stdin").write_text(stdin)
        task = {"env": {**os.environ, **env}, "cwd": str(cwd), "stdin": str(files / "stdin") if stdin is not None
                else None, "stdout": str(files / "stdout"), "stderr": str(files / "stderr"),
                "new_session": start_new_session, "file_size_limit": file_size_limit}  # fmt: skip
        job, pids = self.start(script, list(args), [task])
        (returncode,) = self.wait(job, pids, 600)
        command = [str((self.folder / f"{script}.py").relative_to(REPO)), *args]
        out, err = (files / "stdout").read_text(), (files / "stderr").read_text()
        shutil.rmtree(files, ignore_errors=True)
        return subprocess.CompletedProcess(command, returncode, out, err)


TASKS_PATIENCE = 120  # seconds for a job's tasks to start

forked = ForkServer()
# The benchmarks compare with transformers: the test session's Python, which has it, and its BERT imported once.
forked_benchmarks = ForkServer(lambda: sys.executable, REPO / "bench", ("transformers.models.bert.modeling_bert",))


def run_train_forked(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """`run_train_script`, forked (`ForkServer`): for a test whose subject is the command's result."""
    return forked.run("train", *args, **kwargs)


def pythonpath_with_tests() -> str:
    """PYTHONPATH for a run that loads the tests' own callbacks (`+callbacks.x._target_=helpers.loss_recorder...`)."""
    return os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])


def run_train_recorded(*args: str, new_session: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """`run_train_forked` with the tests' callbacks importable. `new_session`: a process group of its own, so that a
    callback that kills the group (`KillAtStep`) kills this run's processes only."""
    return run_train_forked(*args, start_new_session=new_session, PYTHONPATH=pythonpath_with_tests(), **kwargs)


def run_script_forked(script: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """`python src/<script>.py ARGS` (evaluate, predict, ...), forked (`ForkServer`)."""
    return forked.run(script, *args, **kwargs)


def cpu_twin(trainer: str) -> list[str]:
    """The docs' dry run (docs/scale.md): the trainer config as it is, on CPU processes instead of GPUs."""
    return [f"trainer={trainer}", "trainer.accelerator=cpu", f"trainer.devices={DEVICES[trainer]}"]


def pretrain_overrides(corpus: Path, optimizer: str, phases: int) -> list[str]:
    return [
        "model=bert_tiny",
        "corpus=text",
        f"corpus.paths=[{corpus}]",
        f"optim={optimizer}",
        "task.batch_size=4",
        "task.max_seq_length=64",
        "task.datamodule.vocab_size=400",
        "task.datamodule.dupe_factor=2",
        "task.datamodule.num_workers=0",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "task.checkpoint_every_n_steps=2",
        "logger=csv",
        *([TWO_PHASES] if phases == 2 else []),
    ]


BASE = [
    *TINY_PRETRAIN,
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=4",
    "task.checkpoint_every_n_steps=4",
]


def free_port() -> int:
    """A TCP port nobody listens on now: a job's MASTER_PORT."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
