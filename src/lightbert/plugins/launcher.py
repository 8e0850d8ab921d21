"""The DDP processes that `python src/train.py trainer.devices=N` starts itself: Lightning's subprocess launcher (it
runs the command line again for ranks 1..N-1), with lightbert's watch in place of Lightning's.

Lightning's `_ChildProcessObserver` SIGKILLs every process of the job, the first included, within 5 s of one child's
death: a rank killed by the out-of-memory killer took the first process down wherever it was, without a word (exit
137, seen at the end of a run). Here `processes.watch_launched` watches them instead: the first process says which
rank died and what is saved, once, and is ended by the watch only where it would wait for the dead one
(`processes._Watch`). The children start knowing who launched them (`processes.launching`).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from lightbert.cluster import processes


class RunLauncher(_SubprocessScriptLauncher):
    """`_SubprocessScriptLauncher.launch`, with `processes.launching` around the start of the children and
    `processes.watch_launched` instead of Lightning's observer."""

    def launch(self, function, *args: Any, trainer: L.Trainer | None = None, **kwargs: Any) -> Any:
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            first_rank = self.cluster_environment.node_rank() * self.num_processes
            with processes.launching(first_rank, self.num_processes * self.num_nodes, children=lambda: self.procs):
                self._call_children_scripts()
            processes.watch_launched()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


def use_run_launcher(trainer: L.Trainer) -> None:
    """Lightning's subprocess launcher of `trainer`'s strategy (DDP, FSDP on one node or several) replaced by
    `RunLauncher`; any other launcher (one process, torchrun, SLURM's tasks) is left as it is."""
    strategy = trainer.strategy
    launcher = strategy.launcher
    if type(launcher) is _SubprocessScriptLauncher:
        strategy._launcher = RunLauncher(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)
