"""What reaches the console: lightbert's own log records (data cut or repaired, the checkpoint `init_from` loaded,
phases, "nothing to resume"), from the first process only. `conf/hydra/default.yaml` wires this in; every record
also goes to the run's `train.log`."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from lightbert.cluster.environment import is_global_zero


class RankZero(logging.Filter):
    """Passes the records of the first process: DDP's other processes run the same code and would repeat them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return is_global_zero()


# What the libraries under a run print that a user cannot act on (seen on CPU and on an H100), as fragments of its
# text: kept off the console whether it comes as a Python warning or as a log record of Lightning's (`quiet_console`);
# the tests hold every command's console to it (tests/helpers/runs.py).
CONSOLE_NOISE = (
    # Lightning's tips for other products (litlogger at every Trainer start, litmodels at a checkpoint load), and its
    # device inventory: the run line says where the run goes.
    "Tip: For seamless cloud", "litmodels", "litlogger", "GPU available:", "TPU available:", "HPU available:",
    # How Lightning reads a fine-tune's settings.
    "to estimate number of stepping batches", "so validation will run at the end of the training epoch",
    # The run directory holds .hydra/ when the CSV logger starts writing there: not a problem.
    "exists and is not empty",
    # Lightning's internals against a newer torch.
    "treespec, LeafSpec",
    # DDP's gradient hooks run on the default stream and torch notes at the first backward that AccumulateGrad's
    # stream differs (seen on an H100): nothing a user can change, and no synchronisation DDP does not do anyway.
    "AccumulateGrad node's stream",
    # Loader workers are lightbert's choice, said on the console (task.datamodule.num_workers=auto): Lightning's
    # advice to raise them, on every run of a many-core machine, is not the user's to act on.
    "does not have many workers",
    # A short epoch logs once per epoch instead (plugins.callbacks.ShortEpochLogging).
    "is smaller than the logging interval",
    # A fine-tuning run resumed within an epoch: plugins.callbacks.FineTuningResume says what that epoch trains
    # instead (pre-training's loaders resume by step and never raise it).
    "not resumable",
    # The feature-based tasks keep their frozen encoder in eval mode on purpose (no dropout in the features).
    "in eval mode at the start of training",
)  # fmt: skip


class DropNoise(logging.Filter):
    """Drops the log records that carry `CONSOLE_NOISE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in CONSOLE_NOISE)


def quiet_console() -> None:
    """The console of a run: without `CONSOLE_NOISE` (warnings and Lightning's records), without the datasets
    library's progress bars (on only around maps worth watching: `data.local_files.progress_bars_for`), and
    Lightning's lines above the progress bar."""
    from datasets.utils import logging as datasets_logging

    for noise in CONSOLE_NOISE:
        warnings.filterwarnings("ignore", message=f".*{re.escape(noise)}")
    datasets_logging.disable_progress_bar()
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch"):
        target = logging.getLogger(name)
        if not any(isinstance(f, DropNoise) for f in target.filters):
            target.addFilter(DropNoise())
    for name in ("lightning", "lightning.pytorch"):  # where Lightning adds its console handler at import
        target = logging.getLogger(name)
        for i, handler in enumerate(target.handlers):
            if type(handler) is logging.StreamHandler:
                above = AboveProgressBars(handler.stream)
                above.setFormatter(handler.formatter)
                above.setLevel(handler.level)
                target.handlers[i] = above


class AboveProgressBars(logging.StreamHandler):
    """The console's handler: a record goes above a live progress bar (tqdm takes the bar down, the line is written,
    the bar comes back), not into it (`...0.43it/s, train/loss=10.20]l` / `ightbert: validation at step 10`)."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm  # Lightning's dependency; imported here so the console needs nothing at import

        with tqdm.external_write_mode(file=self.stream):
            super().emit(record)


class RunLogFile(logging.FileHandler):
    """train.log, whose records are held in memory until the run's checks have passed (`RunLogFile.start()`): a
    command that is refused (a finished run's directory, a changed resume) writes nothing into the run directory,
    whatever a library logged while it started. Each handler starts held: in a multirun Hydra makes a new one for
    every job, so a refused job writes nothing either."""

    _configured: ClassVar[list[RunLogFile]] = []  # the handlers logging is configured with now

    def __init__(self, filename: str, mode: str = "a", encoding: str | None = None, delay: bool = True):
        super().__init__(filename, mode, encoding, delay=True)
        self._held: list[logging.LogRecord] | None = []  # None once started
        RunLogFile._configured.append(self)

    def emit(self, record: logging.LogRecord) -> None:
        if self._held is None:
            super().emit(record)
        else:
            self._held.append(record)

    def close(self) -> None:
        if self in RunLogFile._configured:
            RunLogFile._configured.remove(self)
        super().close()

    @classmethod
    def start(cls) -> None:
        """The run's checks have passed: write what was held, and every record from now on."""
        for handler in cls._configured:
            held, handler._held = handler._held or [], None
            for record in held:
                handler.emit(record)


def in_train_log(line: str) -> None:
    """A line the console shows as it is (printed: the run's last line, which names its outputs), kept in train.log
    too, where every other console line is."""
    # As train.log writes the console's other lines: without the console's "lightbert: " prefix.
    record = logging.LogRecord("lightbert", logging.INFO, __file__, 0, line.removeprefix("lightbert: "), None, None)
    for handler in RunLogFile._configured:
        handler.handle(record)


@contextmanager
def logging_like_the_command(output_dir: Path) -> Iterator[None]:
    """Outside a Hydra run (`lightbert.train(cfg)` from a notebook or a script, `cfg` from `compose_config`), the
    console and `train.log` as the command has them for the run: the same logging config, Hydra's `job_logging`,
    applied as Hydra applies it before a job, and put back as it was afterwards. Nothing to do in a Hydra run, whose
    handlers already write into `output_dir`, nor where the caller has logging of its own (a handler on the root
    logger: a script's `logging.basicConfig`, pytest's capture), which lightbert leaves as it is."""
    from hydra.core.hydra_config import HydraConfig

    ours = any(Path(h.baseFilename).parent == output_dir for h in RunLogFile._configured)
    if ours or logging.getLogger().handlers or not HydraConfig.initialized():
        yield
        return
    from hydra.core.utils import configure_log
    from omegaconf import OmegaConf

    touched = [logging.getLogger(), logging.getLogger("lightbert")]
    before = [(lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in touched]
    hydra_config = OmegaConf.create({"hydra": HydraConfig.get()}).hydra  # its ${hydra.runtime...} resolve from here
    configure_log(hydra_config.job_logging, hydra_config.verbose)
    try:
        yield
    finally:
        for lg, handlers, level, propagate, disabled in before:
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled
