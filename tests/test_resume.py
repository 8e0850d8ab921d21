"""Scale and fault tolerance on CPU: DDP equals one process, and a killed run resumes bit for bit."""

import csv
import json
import random
import signal
from pathlib import Path

import pytest
import torch
from helpers.loss_recorder import recorded
from helpers.runs import (
    TINY_PRETRAIN,
    WORDS,
    console_noise,
    pythonpath_with_tests,
    run_train_recorded,
    run_train_script,
    write_bert_corpus,
)

pytestmark = pytest.mark.slow

BASE = [*TINY_PRETRAIN, "trainer.log_every_n_steps=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=10)


@pytest.mark.parametrize(
    ("devices", "streaming", "precision"), [(1, False, "32-true"), (2, False, "32-true"), (1, True, "32-true"),
                                            (1, False, "bf16-true")]
)  # fmt: skip
def test_killed_run_resumes_bit_for_bit(tmp_path, corpus, devices, streaming, precision):
    """SIGKILL after step 10 (last checkpoint at 8), then the same command with resume=true: steps 9-14 give the
    very losses of an uninterrupted run. Dropout is on; the 14 steps cross an epoch and two validations.
    Streamed data fast-forwards to the same batch instead. A bf16 model resumes from its fp32 master weights."""
    stream = ["task.datamodule.streaming=true", "task.datamodule.validation_documents=1"]
    args = [
        *(stream + ["task.datamodule.shuffle_buffer=8"] if streaming else []),
        *BASE,
        f"trainer.precision={precision}",
        f"corpus.paths=[{corpus}]",
        "trainer.max_steps=14",
        "trainer.val_check_interval=5",
        "task.checkpoint_every_n_steps=4",
        f"trainer.devices={devices}",
        *(["trainer.strategy=ddp"] if devices > 1 else []),
        "+callbacks.record._target_=helpers.loss_recorder.RecordLosses",
    ]
    whole = run_train_recorded(
        *args, f"+callbacks.record.path={tmp_path / 'whole.txt'}", f"hydra.run.dir={tmp_path / 'whole'}"
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    reference = recorded(tmp_path / "whole.txt")
    assert max(step for step, _ in reference) == 14 and len(reference) == 14 * devices
    rows = csv.DictReader((tmp_path / "whole" / "metrics.csv").read_text().splitlines())
    epochs = [float(row["epoch"]) for row in rows if row["epoch"]]
    assert max(epochs) >= 1 or streaming  # the steps after the resume cross into a new epoch (a stream has none)

    crashed = tmp_path / "crashed"
    killed = run_train_recorded(
        *args,
        f"+callbacks.record.path={tmp_path / 'before.txt'}",
        "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep",
        "+callbacks.kill.step=10",
        f"hydra.run.dir={crashed}",
        new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL
    before = recorded(tmp_path / "before.txt")
    assert max(step for step, _ in before) == 10 and not (crashed / "results.json").exists()
    assert torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8

    again = run_train_recorded(*args, f"+callbacks.record.path={tmp_path / 'after.txt'}", f"hydra.run.dir={crashed}")
    assert again.returncode == 2 and "resume=true" in again.stderr  # an unfinished run is never overwritten
    resumed = run_train_recorded(
        *args, f"+callbacks.record.path={tmp_path / 'after.txt'}", f"hydra.run.dir={crashed}", "resume=true"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert console_noise(resumed) == []  # e.g. "not resumable": the loader resumes by step, and Lightning is told so
    after = recorded(tmp_path / "after.txt")
    assert sorted(after) == [(step, rank) for step in range(9, 15) for rank in range(devices)]
    for key, losses in after.items():
        assert losses == reference[key], key  # bit for bit
    for key, losses in before.items():
        assert losses == reference[key], key


def test_two_process_ddp_equals_one_process_with_the_same_global_batch(tmp_path, corpus):
    """2 devices x batch 4 against 1 device accumulating 2 x 4: the same examples, masks and weights at every step.

    Dropout is off, because each device draws its own. Both runs leave one run directory under paths.log_dir."""
    args = [
        *BASE,
        f"corpus.paths=[{corpus}]",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "model.hidden_dropout_prob=0",
        "model.attention_probs_dropout_prob=0",
        "+callbacks.record._target_=helpers.loss_recorder.RecordLosses",
    ]
    logs = {}
    for devices, accumulate in ((1, 2), (2, 1)):
        out = tmp_path / f"outputs{devices}"
        result = run_train_recorded(
            *args,
            f"trainer.devices={devices}",
            f"trainer.accumulate_grad_batches={accumulate}",
            *(["trainer.strategy=ddp"] if devices > 1 else []),
            f"+callbacks.record.path={tmp_path / f'losses{devices}.txt'}",
            f"paths.log_dir={out}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("lightbert: finished 6 steps") == 1  # printed by rank zero alone
        runs = list((out / "pretrain" / "runs").iterdir())
        assert len(runs) == 1 and (runs[0] / "results.json").is_file(), runs  # the DDP child used the parent's
        assert not list(out.rglob("multiruns")) and len(list(out.rglob("results.json"))) == 1
        logs[devices] = (tmp_path / f"losses{devices}.txt").read_text().splitlines()

    # Micro-batches in order, 2 per step. Lightning hands callbacks the loss already divided by the 2 accumulated.
    one = [2 * float.fromhex(line.split()[2]) for line in logs[1]]
    two = {(int(s), int(r)): float.fromhex(loss) for s, r, loss, _ in (line.split() for line in logs[2])}
    assert len(one) == 12 and len(two) == 12
    for step in range(1, 7):
        # Micro-batch a of a step is device a's batch; the step's loss is their mean either way.
        for part in (0, 1):
            assert two[(step, part)] == pytest.approx(one[2 * (step - 1) + part], abs=1e-5), (step, part)


def signal_run_args(corpus: Path) -> list[str]:
    return [
        *BASE,
        f"corpus.paths=[{corpus}]",
        "trainer.max_steps=9",
        "trainer.val_check_interval=4",
        "task.checkpoint_every_n_steps=100",  # no periodic checkpoint: only SIGTERM's
        "+callbacks.record._target_=helpers.loss_recorder.RecordLosses",
    ]


@pytest.fixture(scope="module")
def unstopped_losses(corpus, tmp_path_factory) -> dict:
    """The per-step losses of the signal tests' run left to finish: one reference for every signal."""
    where = tmp_path_factory.mktemp("unstopped")
    whole = run_train_recorded(
        *signal_run_args(corpus), f"+callbacks.record.path={where / 'whole.txt'}", f"hydra.run.dir={where / 'run'}"
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    return recorded(where / "whole.txt")


@pytest.mark.parametrize("name", ["TERM", "USR2", "INT"])
def test_stop_signal_saves_the_latest_checkpoint_and_the_run_resumes_exactly(tmp_path, corpus, unstopped_losses, name):
    """SIGTERM, USR2 in a job that submitit started on SLURM (its warning before the time limit), or Ctrl-C."""
    args = signal_run_args(corpus)
    stopped = tmp_path / "stopped"
    terminated = run_train_script(  # the signal's subject is the process: `python src/train.py` itself
        *args,
        f"+callbacks.record.path={tmp_path / 'before.txt'}",
        "+callbacks.term._target_=helpers.loss_recorder.SignalAtStep",
        "+callbacks.term.step=5",
        f"+callbacks.term.name={name}",
        f"hydra.run.dir={stopped}",
        PYTHONPATH=pythonpath_with_tests(),
        **({"SUBMITIT_EXECUTOR": "slurm"} if name == "USR2" else {}),
    )
    stop = getattr(signal, f"SIG{name}")  # the exit status and the console name the signal that stopped it
    assert terminated.returncode == 128 + stop and not (stopped / "results.json").exists()
    assert f"stopped by {stop.name}" in terminated.stderr
    assert f"hydra.run.dir={stopped} resume=true" in terminated.stderr  # where to continue, named
    checkpoint = torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 5  # saved after the batch it was running, before exiting
    assert max(step for step, _ in recorded(tmp_path / "before.txt")) == 5
    resumed = run_train_recorded(
        *args, f"+callbacks.record.path={tmp_path / 'after.txt'}", f"hydra.run.dir={stopped}", "resume=true"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference, after = unstopped_losses, recorded(tmp_path / "after.txt")
    assert sorted(after) == [(step, 0) for step in range(6, 10)]
    assert all(after[key] == reference[key] for key in after)


@pytest.mark.parametrize("recipe", ["bert_base_paper", "bert_large_paper"])
def test_paper_recipe_runs_both_phases_and_phase_two_starts_from_phase_one(tmp_path, recipe):
    """A tiny version of the recipe: 10 steps, 9 at 128 tokens then 1 at 512, through the entry point."""
    rng = random.Random(0)
    documents = [  # 8 documents of 40 sentences: long enough for 512-token pairs
        "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(40))
        for _ in range(8)
    ]
    corpus = tmp_path / "long.txt"
    corpus.write_text("\n\n".join(documents) + "\n")
    run_dir = tmp_path / "run"
    args = [
        f"experiment={recipe}",
        *BASE,
        "task.max_seq_length=128",
        f"corpus.paths=[{corpus}]",
        "trainer.max_steps=10",
        "trainer.val_check_interval=3",
        "+callbacks.record._target_=helpers.loss_recorder.RecordLosses",
        f"+callbacks.record.path={tmp_path / 'losses.txt'}",
    ]
    result = run_train_recorded(*args, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "phase 1/2: steps 0-9" in log and "phase 2/2: steps 9-10" in log
    rows = [line.split() for line in (tmp_path / "losses.txt").read_text().splitlines()]
    assert [int(row[0]) for row in rows] == list(range(1, 11))  # phase 2 continued the step count and the schedule
    lengths = [int(row[3]) for row in rows]
    assert max(lengths[:9]) <= 128 < lengths[9]  # phase 2 read examples of up to 512 tokens
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 10
    checkpoint = torch.load(results["last_checkpoint"], weights_only=True)
    schedule = checkpoint["lr_schedulers"][0]
    assert schedule["last_epoch"] == 10 and checkpoint["optimizer_states"][0]["state"]  # one schedule, one optimizer
    assert checkpoint["hyper_parameters"]["model"]["max_position_embeddings"] == 512


def test_a_fine_tune_resumed_within_an_epoch_says_what_that_epoch_trains(tmp_path):
    """A fine-tune killed at step 3 of an epoch of 6 (its last checkpoint at step 2), resumed: one line says what
    the rest of that epoch trains, and Lightning's "your dataloader is not resumable" warning (once on
    every such resume, naming nothing a user can do) is gone."""
    from helpers.glue_files import glue_data_files, glue_overrides
    from helpers.models import write_hf_bert

    files = glue_data_files(tmp_path / "data", "sst2", "jsonl", num_rows=48)  # 48 rows, batches of 8: 6 steps
    args = [*glue_overrides("sst2", files, write_hf_bert(tmp_path / "bert")), "trainer.max_epochs=1",
            "+task.checkpoint_every_n_steps=2", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    killed = run_train_recorded(
        *args, "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=3", new_session=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_train_recorded(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    console = resumed.stdout + resumed.stderr
    said = (
        "lightbert: resumed at step 2, 2 of the 6 steps of epoch 1: fine-tuning data does not resume mid-epoch, "
        "so that epoch's last 4 steps take the first batches of a pass over the training set started again"
    )
    assert console.count(said) == 1, console[-3000:]
    assert "not resumable" not in console and "Traceback" not in console
    assert json.loads((tmp_path / "run" / "results.json").read_text())["global_step"] == 6
