"""Which process is which in a job of several, decided before the Trainer exists, from the cluster environment
Lightning will use; and submitit's local executor's tasks given the variables Lightning reads."""

from __future__ import annotations

import os
import sys
import zlib


def _number(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def cluster_environment() -> str:
    """The cluster environment Lightning will pick for this process, in its order (torchelastic first, as it can
    run inside SLURM; then SLURM, LSF; else Lightning's own, which `NODE_RANK` and `LOCAL_RANK` describe)."""
    if all(name in os.environ for name in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        return "torchelastic"  # torch.distributed.is_torchelastic_launched(), without importing torch
    if "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return "slurm"
    if {"LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"} <= set(os.environ):
        return "lsf"
    return "lightning"


def first_process() -> bool:
    """Whether this process is the whole job's first, decided before the Trainer exists (before anything is written)
    from the environment Lightning will use: one process of all nodes takes the run directory and writes its
    record. Lightning's own early guess (`RANK`, `LOCAL_RANK`, `SLURM_PROCID`) makes the first process of every node
    of a `NODE_RANK` launch a rank 0."""
    environment = cluster_environment()
    if environment == "torchelastic":
        return _number("RANK") == 0
    if environment == "slurm":
        return _number("SLURM_PROCID") == 0
    if environment == "lsf":
        return _number("JSM_NAMESPACE_RANK") == 0
    node = _number("NODE_RANK") if "NODE_RANK" in os.environ else _number("GROUP_RANK")
    return node == 0 and _number("LOCAL_RANK") == 0


def adopt_submitit_local_ranks() -> None:
    """The tasks of a `cluster=submitit_local` job (tasks_per_node = trainer.devices) as Lightning's processes:
    submitit's local executor starts every task itself and names them in its own variables, which no Lightning
    environment reads; without these each task would think itself rank 0 and start DDP processes of its own. A no-op
    elsewhere (SLURM's tasks carry SLURM's variables, which Lightning reads)."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")) < 2:
        return
    os.environ["LOCAL_RANK"] = os.environ.get("SUBMITIT_LOCAL_LOCALID", "0")
    os.environ["NODE_RANK"] = os.environ.get("SUBMITIT_LOCAL_NODEID", "0")
    os.environ["WORLD_SIZE"] = os.environ["SUBMITIT_LOCAL_NTASKS"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # The same port in every task of the job, another for each job of a sweep (they may run at the same time).
    job = os.environ.get("SUBMITIT_LOCAL_JOB_ID", "0")
    os.environ.setdefault("MASTER_PORT", str(20000 + zlib.crc32(job.encode()) % 20000))


def is_global_zero() -> bool:
    """The first process of the run: the process group's rank 0 once it exists (Lightning's strategy makes it),
    before that the cluster environment's (`first_process`)."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank() == 0
    return first_process()
