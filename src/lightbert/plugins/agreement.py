"""One decision per job: every process of a multi-node job decides alone, before the process group exists, whether
it resumes (it reads the run directory); once the group exists they compare, and a job whose processes decided
differently stops on every node with one line naming the node that disagrees, before a step is trained.

What this catches: a run directory that is not shared between nodes (node 0 resumes from its last.ckpt, node 1 finds
none and starts from fresh weights: DDP would average the gradients of two different models without a word), or a
last.ckpt that one node sees and another does not yet.

The same gather tells every process the others' ranks, hosts and process ids: which process died, if one does
(`processes.lost_processes`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import lightning as L
import torch

from lightbert.cluster import processes
from lightbert.errors import UserError


class SameResumeOnEveryNode(L.Callback):
    def __init__(self, output_dir: Path, resumed_step: int | None) -> None:
        self.output_dir = output_dir
        self.resumed_step = resumed_step  # None: starts from the beginning

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if trainer.world_size == 1 or not torch.distributed.is_initialized():
            return
        mine = {"node": trainer.node_rank, "host": socket.gethostname(), "step": self.resumed_step,
                "rank": trainer.global_rank, "pid": os.getpid()}  # fmt: skip
        everyone: list = [None] * trainer.world_size
        torch.distributed.all_gather_object(everyone, mine)  # every process reaches this, once, at the same hook
        processes.record_members(everyone)  # who to name if one dies (`processes.lost_processes`)
        first = everyone[0]
        other = next((d for d in everyone if d["step"] != first["step"]), None)
        if other is None:
            return
        raise UserError(
            f"node {other['node']} ({other['host']}) {_decision(other)} in {self.output_dir}, and node "
            f"{first['node']} ({first['host']}) {_decision(first)}: the nodes do not see the same run directory. "
            "Put it on a file system every node shares (hydra.run.dir=...) and run the command again"
        )


def _decision(process: dict) -> str:
    if process["step"] is None:
        return "finds no checkpoints/last.ckpt to resume from"
    return f"resumes from step {process['step']}"
