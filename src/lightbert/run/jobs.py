"""`train` and `evaluate`: one experiment from a composed Hydra config, the one path of a run. `src/train.py` and
`src/evaluate.py` (and `lightbert-train`, `lightbert-evaluate`) call them; so do notebooks and tests.

The path of one run: its settings, built once and checked (`run.settings`), before torch and Lightning load, so a
bad value is refused in a second; the run directory held and how it starts decided (`run_dir.held`); then the flow
(`run.flows`): the checks on this machine and the record, the DataModule and the LightningModule with init_from's
weights, the Trainer, fit, the results.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig

from lightbert.cluster import processes
from lightbert.cluster.environment import adopt_submitit_local_ranks
from lightbert.errors import UserError
from lightbert.run.config_checks import checked_config
from lightbert.run.console import logging_like_the_command
from lightbert.run.run_dir import held
from lightbert.run.settings import RunSettings


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train and validate as `cfg` says; write `results.json` in the run directory and return its content. The one
    path of a training run: `python src/train.py` (and `lightbert-train`) calls it, and so do notebooks and tests.

    The run directory is the user's record: it is held for this run alone, and a command refused by the checks
    before training writes nothing into it. SIGTERM or Ctrl-C ends the process as they end the command: during
    training after the current batch, with `last.ckpt` saved and one line that says how to continue, then exit
    128 + the signal's number; before or after training at once, with one line."""
    adopt_submitit_local_ranks()  # before anything asks which process this is
    # A bad value is refused here, before anything is read or written: the config as a whole, then its parts.
    settings = RunSettings.from_config(cfg, checked_config(cfg))
    processes.install()  # its DataLoader workers and data-preparation pool die with it, and hold no lock
    with (
        logging_like_the_command(settings.output_dir),
        held(settings) as start,
        processes.stops_cleanly(settings.output_dir),
    ):
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from lightbert.plugins import checkpointing
        from lightbert.run.flows import fit

        try:
            return fit(settings, start)
        except SIGTERMException:
            # Lightning stopped after the current batch and LatestCheckpoint saved it; exit as a process killed by
            # the signal does (SIGTERM, or SIGINT for Ctrl-C).
            stopped_by = checkpointing.stopped_by
            print(
                f"lightbert: stopped by {stopped_by.name}; the latest state is in "
                f"{settings.output_dir}/checkpoints/last.ckpt. To continue, rerun the same command with "
                f"hydra.run.dir={settings.output_dir} resume=true",
                file=sys.stderr,
            )
            sys.exit(128 + stopped_by)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Score the fine-tuned model `init_from` names on the task's validation splits and write the prediction files a
    training run writes, into a new run directory (`results.json` there); the checkpoint's own is never touched."""
    adopt_submitit_local_ranks()
    settings = RunSettings.from_config(cfg, checked_config(cfg))
    if not settings.init_from:
        raise UserError("src/evaluate.py scores a fine-tuned model: set init_from=<run directory | .ckpt | HF dir>")
    processes.install()
    with logging_like_the_command(settings.output_dir), held(settings, evaluation=True) as start:
        from lightbert.run.flows import validate

        return validate(settings, start)
