"""A loss that becomes NaN stops the run: one line names the step and the loss and the checkpoint to go on from, no
checkpoint holds the NaN state, and results.json is JSON. `optim.weight_decay=1e6` makes it happen in a few steps:
each step multiplies the weights by about 1 - lr x 1e6, until the forward overflows."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers.glue_files import glue_data_files
from helpers.models import write_hf_bert
from helpers.runs import BASE, compose_config, cpu_twin, run_train_forked

from lightbert import train
from lightbert.errors import UserError
from lightbert.run.outputs import write_results

DIVERGING = "optim.weight_decay=1e6"
STOP = re.compile(r"lightbert: error: the training loss is (nan|inf|-inf) at step (\d+): the run stopped there; ")


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as JSON itself (and every strict reader) does."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def checkpoint_steps(run_dir: Path) -> dict[str, int]:
    """Each checkpoint file's step, once every floating-point tensor of it is shown finite."""
    steps = {}
    for path in sorted((run_dir / "checkpoints").glob("*.ckpt")):
        checkpoint = torch.load(path, weights_only=True, map_location="cpu")
        for name, tensor in checkpoint["state_dict"].items():
            assert not tensor.is_floating_point() or torch.isfinite(tensor).all(), f"{path.name}: {name} is not finite"
        steps[path.name] = int(checkpoint["global_step"])
    return steps


def pretraining(corpus: Path, run_dir: Path, *more: str) -> list[str]:
    return [*BASE, f"corpus.paths=[{corpus}]", "trainer.max_steps=20", DIVERGING, f"hydra.run.dir={run_dir}", *more]


def one_stop(output: str) -> re.Match:
    lines = [line for line in output.splitlines() if "the run stopped there" in line]
    assert len(lines) == 1, output[-3000:]
    stop = STOP.match(lines[0])
    assert stop, lines[0]
    return stop


def test_a_nan_loss_stops_pretraining_at_its_step_and_keeps_the_last_finite_checkpoint(tmp_path, corpus_file):
    """Checked at every logged step (trainer.log_every_n_steps=1 here): the run stops at the first step whose loss is
    NaN, with exit 2 and one line, before anything of that step is saved. Before, it ran its 20 steps, exited 0 with
    "best val/loss=inf", kept NaN checkpoints and wrote NaN into results.json. A resume from the kept checkpoint loads
    it and retraces the same steps to the same stop."""
    run_dir = tmp_path / "run"
    stopped = run_train_forked(*pretraining(corpus_file, run_dir))
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    stop = one_stop(stopped.stderr)
    step = int(stop.group(2))
    last = run_dir / "checkpoints" / "last.ckpt"
    steps = checkpoint_steps(run_dir)
    assert steps["last.ckpt"] == 4 < step < 8  # every 4 steps (BASE): the last finite one is kept
    assert f"the last finite state is {last} (step 4): resume=true (hydra.run.dir={run_dir})" in stopped.stderr
    assert not (run_dir / "results.json").exists()  # the run did not finish (as a signal's stop)
    losses = [row["train/loss"] for row in csv_rows(run_dir) if row.get("train/loss")]
    assert losses and all(math.isfinite(float(loss)) for loss in losses)  # the NaN step's row is not logged

    resumed = run_train_forked(*pretraining(corpus_file, run_dir, "resume=true"))
    assert "resumed from step 4" in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    assert resumed.returncode == 2 and one_stop(resumed.stderr).groups() == stop.groups()
    assert checkpoint_steps(run_dir)["last.ckpt"] == 4


def test_a_nan_loss_between_logged_steps_is_caught_before_the_next_checkpoint(tmp_path, corpus_file):
    """Logged every 50 steps (longer than the run): the loss is read on the host only where a checkpoint is saved,
    and the line still names the first NaN step, not the save's."""
    run_dir = tmp_path / "run"
    stopped = run_train_forked(*pretraining(corpus_file, run_dir, "trainer.log_every_n_steps=50"))
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    step = int(one_stop(stopped.stderr).group(2))
    assert set(checkpoint_steps(run_dir).values()) == {4} and 4 < step < 8  # last.ckpt and the best, both step 4
    assert not (run_dir / "results.json").exists()


def test_a_nan_loss_stops_fine_tuning(tmp_path):
    """The library verb: the same stop as an error (UserError, which the command prints as one line), with the best
    checkpoint of a finite epoch kept and no checkpoint of a NaN one."""
    files = glue_data_files(tmp_path / "data", "sst2", "jsonl", num_rows=48)
    overrides = [
        "task=glue/sst2",
        f"init_from={write_hf_bert(tmp_path / 'bert')}",
        "trainer=cpu",
        "logger=csv",
        "task.datamodule.num_workers=0",
        "trainer.max_steps=-1",
        "trainer.max_epochs=3",
        "task.batch_size=8",
        "task.max_seq_length=32",
        "optim.lr=1e-3",
        "optim.weight_decay=3e4",  # x (1 - 30) a step at the peak rate: NaN in the second epoch (of 6 steps)
        *(f"task.data_files.{split}={path}" for split, path in files.items()),
    ]
    run_dir = tmp_path / "run"
    with pytest.raises(UserError, match=r"the training loss is (nan|inf|-inf) at step \d+: the run stopped there"):
        train(compose_config(overrides, run_dir))
    assert checkpoint_steps(run_dir) == {"best-step6.ckpt": 6, "last.ckpt": 6}  # the first epoch's, finite
    assert not (run_dir / "results.json").exists()


def test_results_json_holds_no_nan_or_infinity(tmp_path):
    """A metric that is NaN (a validation of NaN losses) and a best score of inf (Lightning's for a NaN monitor) are
    written as null: before, results.json held NaN and Infinity, which no strict JSON reader accepts."""
    results = {
        "metrics": {"val/loss": math.nan, "val/mlm_accuracy": 0.5},
        "monitor": "val/loss",
        "best_score": math.inf,
        "best_metrics": None,
        "global_step": 8,
        "seconds": 1.0,
    }
    write_results(results, tmp_path)
    written = strict_json((tmp_path / "results.json").read_text())
    assert written["metrics"] == {"val/loss": None, "val/mlm_accuracy": 0.5} and written["best_score"] is None


def csv_rows(run_dir: Path) -> list[dict]:
    import csv

    with (run_dir / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_a_nan_loss_stops_every_ddp_process_together(tmp_path, corpus_file):
    """Two CPU processes: the stop is agreed before the next step (with the signals', in the same all-reduce), the
    line said once, and no process left behind."""
    run_dir = tmp_path / "run"
    stopped = run_train_forked(*cpu_twin("ddp"), *pretraining(corpus_file, run_dir))
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    step = int(one_stop(stopped.stderr).group(2))
    assert checkpoint_steps(run_dir)["last.ckpt"] == 4 < step
