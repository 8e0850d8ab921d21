"""Several nodes as real processes on one machine, launched as clusters launch them: Lightning's documented variables
(`MASTER_ADDR`, `MASTER_PORT`, `NODE_RANK`, `WORLD_SIZE`) with one `python src/train.py` per node, or torchrun on
each node; each node with a cache of its own. Exactly one process of the whole job takes the run directory and writes
its record; a job whose nodes see different run directories stops with one line naming the node, instead of training
two models as one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from helpers import runtime
from helpers.runs import REPO, TINY_PRETRAIN, default_sigint, free_port, write_bert_corpus
from helpers.tasks import tasks

pytestmark = pytest.mark.slow

TINY = [*TINY_PRETRAIN, "trainer.strategy=ddp"]
# Seconds: a run here takes well under a minute; past this, the nodes wait on each other for ever.
PATIENCE = int(os.environ.get("LIGHTBERT_TEST_PATIENCE", 240))


# What a node's environment must not inherit from the test's (the suite may itself run inside a SLURM or torchrun job).
INHERITED = ("RANK", "LOCAL_RANK", "GROUP_RANK", "SLURM_NTASKS", "SLURM_PROCID", "TORCHELASTIC_RUN_ID")


def node_env(node: int, root: Path) -> dict[str, str]:
    return {"LIGHTBERT_CACHE": str(root / f"cache-node{node}"), "OMP_NUM_THREADS": "1"}  # a node's local disk


def run_nodes(
    args: list[str], nodes: int, devices: int, root: Path, cwds: list[Path] | None = None
) -> list[subprocess.CompletedProcess]:
    """One `python src/train.py` per node with Lightning's documented variables, side by side: tasks forked from the
    tests' fork server (`helpers.tasks`: a process of their own each, in a session of their own; the DDP processes a
    node launches are fresh interpreters); `cwds`: each node's working directory (a relative hydra.run.dir is then
    another directory on each node, as a run directory on a node's local disk is). A node still running after
    PATIENCE seconds is a deadlock: all are killed, and the test fails."""
    port = str(free_port())
    variables = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(nodes * devices)}
    envs = [{**node_env(node, root), **variables, "NODE_RANK": str(node)} for node in range(nodes)]
    command = [*TINY, *args, f"trainer.num_nodes={nodes}", f"trainer.devices={devices}"]
    logs = Path(tempfile.mkdtemp(dir=root, prefix="nodes-"))
    job, pids = tasks.start(command, envs, logs, cwds=cwds, unset=INHERITED)
    codes = tasks.wait(job, pids, PATIENCE)
    return [
        subprocess.CompletedProcess(command, code, (logs / f"task{node}.out").read_text(),
                                    (logs / f"task{node}.err").read_text())
        for node, code in enumerate(codes)
    ]  # fmt: skip


def start_torchrun_nodes(
    args: list[str], nodes: int, devices: int, root: Path, base: list[str]
) -> list[subprocess.Popen]:
    """On each node `torchrun --nnodes=... src/train.py` (which starts the node's processes, as a cluster's torchrun
    line does): fresh interpreters, torchrun's own."""
    port = str(free_port())
    started = []
    for node in range(nodes):
        env = {**os.environ, **node_env(node, root)}
        for name in INHERITED:
            env.pop(name, None)
        launcher = [f"--nnodes={nodes}", f"--node-rank={node}", f"--nproc-per-node={devices}"]
        launcher += ["--master-addr=127.0.0.1", f"--master-port={port}"]
        command = [runtime.python(), "-m", "torch.distributed.run", *launcher, str(REPO / "src" / "train.py"), *base]
        command += [*args, f"trainer.num_nodes={nodes}", f"trainer.devices={devices}"]
        started.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env=env,
                start_new_session=True,
                preexec_fn=default_sigint,
            )
        )
    return started


def finish_nodes(started: list[subprocess.Popen]) -> list[subprocess.CompletedProcess]:
    """Every node's result; a node still running after PATIENCE seconds is a deadlock: all are killed, and it fails."""
    deadline = time.monotonic() + PATIENCE
    for process in started:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    hung = [node for node, process in enumerate(started) if process.poll() is None]
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the node's DDP children too
    results = []
    for process in started:
        out, err = process.communicate()
        results.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    if hung:
        tails = "\n".join(f"node {n}: {r.stderr[-1500:]}" for n, r in enumerate(results))
        pytest.fail(f"node(s) {hung} still running after {PATIENCE} s: a deadlock\n{tails}")
    return results


@pytest.fixture
def corpus(tmp_path):
    return write_bert_corpus(tmp_path / "corpus.txt", num_documents=40)  # held out: more examples than processes


@pytest.mark.parametrize("devices", [1, 2])
def test_two_nodes_launched_with_lightnings_variables_train_one_run(tmp_path, corpus, devices):
    run = tmp_path / "run"
    args = [f"corpus.paths=[{corpus}]", "trainer.max_steps=4", "trainer.val_check_interval=2", f"hydra.run.dir={run}"]
    results = run_nodes(args, nodes=2, devices=devices, root=tmp_path)
    for result in results:
        assert result.returncode == 0, "\n".join(f"node {n}: {r.stderr[-2500:]}" for n, r in enumerate(results))
    assert json.loads((run / "results.json").read_text())["global_step"] == 4
    console = "".join(r.stdout + r.stderr for r in results)
    assert console.count("lightbert: run directory:") == 1  # one process of the job speaks, and records
    assert console.count("lightbert: finished 4 steps") == 1
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "tokenizer.json").is_file()


# trainer=fsdp on CPU processes, in place of TINY's trainer=cpu with DDP.
FSDP = [o for o in TINY_PRETRAIN if o != "trainer=cpu"] + ["trainer=fsdp", "trainer.accelerator=cpu"]


def test_two_nodes_launched_with_torchrun_train_one_run(tmp_path, corpus):
    """`torchrun --nnodes=2 --node-rank=i --nproc-per-node=2` on each node: torchelastic's variables name the ranks,
    and FSDP shards over the 4 processes of the 2 nodes. DDP over two nodes runs in the test above: torchrun starts
    the processes of either strategy the same way."""
    devices = 2
    run = tmp_path / "run"
    args = [f"corpus.paths=[{corpus}]", "trainer.max_steps=4", "trainer.val_check_interval=2", f"hydra.run.dir={run}"]
    results = finish_nodes(start_torchrun_nodes(args, nodes=2, devices=devices, root=tmp_path, base=FSDP))
    for result in results:
        assert result.returncode == 0, "\n".join(f"node {n}: {r.stderr[-2500:]}" for n, r in enumerate(results))
    assert json.loads((run / "results.json").read_text())["global_step"] == 4
    console = "".join(r.stdout + r.stderr for r in results)
    assert console.count("lightbert: run directory:") == 1 and console.count("lightbert: finished 4 steps") == 1
    assert f"{devices} x cpu x 2 nodes, strategy fsdp (FSDP2, fully_shard)" in console
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["job_shape"]["world_size"] == 2 * devices


def test_nodes_that_see_different_run_directories_stop_naming_the_node(tmp_path, corpus):
    """Node 1's run directory is not node 0's (not shared): node 0 resumes from its last.ckpt, node 1 finds none.
    Trained on, DDP would average the gradients of two different models (node 1's fresh ones)."""
    homes = [tmp_path / "node0", tmp_path / "node1"]
    for home in homes:
        home.mkdir()
    args = [f"corpus.paths=[{corpus}]", "trainer.max_steps=4", "trainer.val_check_interval=2", "hydra.run.dir=run"]
    first = run_nodes(args, 2, 1, tmp_path, cwds=[homes[0], homes[0]])  # shared, this time
    assert [r.returncode for r in first] == [0, 0], first[0].stderr[-3000:]
    (homes[0] / "run" / "results.json").unlink()  # as if it had stopped after its last checkpoint (step 4)
    results = run_nodes([*args, "resume=true"], 2, 1, tmp_path, cwds=homes)
    assert [r.returncode for r in results] == [2, 2], [r.stderr[-2000:] for r in results]
    for result in results:
        line = next(x for x in result.stderr.splitlines() if x.startswith("lightbert: error:"))
        assert "node 1 (" in line and "finds no checkpoints/last.ckpt to resume from" in line, line
        assert "node 0 (" in line and "resumes from step 4" in line and "Traceback" not in result.stderr
    assert not (homes[1] / "run" / "checkpoints").exists()  # nothing trained on node 1
