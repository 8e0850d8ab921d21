"""trainer=fsdp (torch's FSDP2, fully_shard) on 2 CPU processes over gloo, as the README's dry run starts it: the
weights sharded in halves, one full last.ckpt that a kill -9 resumes from bit for bit (and on one process), a
fine-tune under FSDP from it with init_from, src/evaluate.py and `convert to-hf` of it; and every task model's
gradients under FSDP, which are the unsharded model's, with no unit returning a view."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import signal
from pathlib import Path

import pytest
import torch
import torch.multiprocessing
from helpers.glue_files import glue_data_files
from helpers.loss_recorder import recorded
from helpers.runs import TINY_PRETRAIN, free_port, run_script_forked, run_train_recorded, snapshot, write_bert_corpus
from helpers.sharded_step import gradients

from lightbert.interop.convert import main as convert

pytestmark = pytest.mark.slow

FSDP_ON_CPU = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2"]  # bf16-mixed, as on GPUs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted FSDP pre-training run of 8 steps, and the same run killed (SIGKILL) after step 6, its last
    checkpoint at step 4; losses recorded per step and rank."""
    return fsdp_runs(tmp_path_factory.mktemp("fsdp"))


def fsdp_runs(root: Path, *overrides: str) -> dict[str, Path]:
    corpus = write_bert_corpus(root / "corpus.txt", num_documents=10)
    args = [
        *TINY_PRETRAIN,
        *FSDP_ON_CPU,
        *overrides,
        f"corpus.paths=[{corpus}]",
        "task.global_batch_size=8",  # kept on one process by accumulating 2 (test_resume_on_one_process)
        "trainer.max_steps=8",
        "trainer.val_check_interval=3",
        "task.checkpoint_every_n_steps=4",
        "+callbacks.record._target_=helpers.loss_recorder.RecordLosses",
    ]
    whole = run_train_recorded(
        *args,
        f"hydra.run.dir={root / 'whole'}",
        f"+callbacks.record.path={root / 'whole.txt'}",
        "+callbacks.shards._target_=helpers.loss_recorder.RecordShards",
        f"+callbacks.shards.path={root / 'shards.txt'}",
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run_train_recorded(
        *args,
        f"hydra.run.dir={root / 'killed'}",
        f"+callbacks.record.path={root / 'killed.txt'}",
        "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep",
        "+callbacks.kill.step=6",
        new_session=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    return {"root": root, "whole": root / "whole", "killed": root / "killed", "args": args, "console": whole.stdout}


def test_each_process_holds_half_of_every_weight_and_the_checkpoint_the_whole(runs):
    shards = [line.split() for line in (runs["root"] / "shards.txt").read_text().splitlines()]
    held = {(int(rank), name): (local, full, kind, tied) for rank, name, local, full, kind, tied in shards}
    assert held[(0, "qkv")] == held[(1, "qkv")] == ("192x128", "384x128", "DTensor", "True")  # query, key, value
    vocab = int(held[(0, "word_embeddings")][1].split("x")[0])
    rows = [int(held[(rank, "word_embeddings")][0].split("x")[0]) for rank in (0, 1)]
    assert rows == [(vocab + 1) // 2, vocab // 2]  # the tied embeddings and decoder: one weight, sharded once
    console = runs["console"]
    assert "2 x cpu, strategy fsdp (FSDP2, fully_shard), bf16-mixed" in console
    assert "padded under trainer=fsdp" in console
    checkpoint = torch.load(runs["whole"] / "checkpoints" / "last.ckpt", weights_only=True)
    weights = checkpoint["state_dict"]
    assert weights["model.bert.encoder.layer.0.attention.self.query.weight"].shape == (128, 128)  # gathered
    tokens = checkpoint["hyper_parameters"]["model"]["vocab_size"]  # the tokenizer's; the model pads to 64 inside
    assert vocab % 64 == 0 and vocab - 64 < tokens <= vocab
    assert weights["model.cls.predictions.decoder.weight"].shape == (tokens, 128)
    assert weights["model.bert.embeddings.word_embeddings.weight"].shape == (tokens, 128)
    assert all(tensor.dtype == torch.float32 for tensor in weights.values())  # fp32 shards, bf16 only gathered
    assert checkpoint["global_step"] == 8


def test_sharded_gradients_are_the_unsharded_models_and_no_unit_returns_a_view():
    """Every task's model under FSDP on 2 processes (32-true): each parameter's gradient, gathered, is the unsharded
    model's on the whole batch (1e-6 relative), and FSDP never warns that a unit returned a view (an in-place op on
    one would skip its weights' gather in the backward). Before, every run warned of its root unit, the task's
    model: its heads return views (the MLM logits narrowed from the padded vocabulary's, ...)."""
    with multiprocessing.Manager() as manager:
        results = manager.dict()
        # Forked from this process: the subject is the sharded backward, not the start of two interpreters.
        torch.multiprocessing.start_processes(gradients, args=(2, free_port(), results), nprocs=2, start_method="fork")
        results = dict(results)
    assert results.pop("view warnings 0") == results.pop("view warnings 1") == []
    assert len(results) == 6 and all(worst < 1e-6 for worst in results.values()), results


@pytest.fixture(scope="module")
def stableadamw_runs(tmp_path_factory) -> dict[str, Path]:
    """The same two runs with the modern recipe's optimiser (its per-tensor step counts and RMS over sharded
    weights, its state gathered into the full checkpoint and sharded again on resume)."""
    return fsdp_runs(tmp_path_factory.mktemp("fsdp-stableadamw"), "optim=stableadamw")


@pytest.mark.parametrize("optimizer", ["adamw", "stableadamw"])
def test_a_killed_fsdp_run_resumes_bit_for_bit(request, optimizer, tmp_path):
    runs = request.getfixturevalue("runs" if optimizer == "adamw" else "stableadamw_runs")
    crashed = tmp_path / "crashed"
    shutil.copytree(runs["killed"], crashed)
    checkpoint = torch.load(crashed / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 4 and checkpoint["hyper_parameters"]["optim"]["name"] == optimizer
    resumed = run_train_recorded(
        *runs["args"], f"hydra.run.dir={crashed}", f"+callbacks.record.path={tmp_path / 'after.txt'}", "resume=true"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference, after = recorded(runs["root"] / "whole.txt"), recorded(tmp_path / "after.txt")
    assert sorted(after) == [(step, rank) for step in range(5, 9) for rank in range(2)]
    for key, losses in after.items():
        assert losses == reference[key], key  # bit for bit
    assert recorded(runs["root"] / "killed.txt").items() <= reference.items()


def test_a_killed_fsdp_run_resumes_on_one_process(runs, tmp_path):
    """The full-state checkpoint loads into another sharding: one process, accumulating 2 batches of 4 per step."""
    crashed = tmp_path / "crashed"
    shutil.copytree(runs["killed"], crashed)
    resumed = run_train_recorded(
        *runs["args"], "trainer.devices=1", f"hydra.run.dir={crashed}",
        f"+callbacks.record.path={tmp_path / 'after.txt'}", "resume=true",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout + resumed.stderr
    assert "resuming on 1 device(s), the checkpoint's job had 2: the global batch stays 8" in out
    # Steps 5-8, 2 micro-batches each (a step's first is recorded before the optimizer steps, at the step before).
    batches = [int(line.split()[0]) for line in (tmp_path / "after.txt").read_text().splitlines()]
    assert batches == [4, 5, 5, 6, 6, 7, 7, 8]
    assert json.loads((crashed / "results.json").read_text())["global_step"] == 8


def test_a_killed_fsdp_run_resumed_under_ddp_is_refused_naming_the_trainer(runs, tmp_path):
    """Its optimizer state is keyed by parameter name, DDP's by position: a resume under another strategy is
    refused before anything starts, naming the option to put back, and the run directory is left as it was."""
    crashed = tmp_path / "crashed"
    shutil.copytree(runs["killed"], crashed)
    before = snapshot(crashed)
    under_ddp = [a for a in runs["args"] if a not in (*FSDP_ON_CPU, "trainer=cpu")]
    under_ddp += ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
    refused = run_train_recorded(
        *under_ddp, f"hydra.run.dir={crashed}", f"+callbacks.record.path={tmp_path / 'after.txt'}", "resume=true"
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = next(x for x in refused.stderr.splitlines() if x.startswith("lightbert: error:"))
    assert "trainer=fsdp recorded, trainer=ddp now" in line and "Traceback" not in refused.stderr, line
    assert snapshot(crashed) == before and not (tmp_path / "after.txt").exists()


def test_a_fine_tune_under_fsdp_from_the_fsdp_run_evaluates_and_converts(runs, tmp_path):
    """sst2 under FSDP with init_from the FSDP run: 9 validation and 9 test sentences on 2 processes, batches of 4,
    so one process has a batch fewer and runs a padding batch that counts nowhere. src/evaluate.py scores the
    fine-tuned checkpoint on one process with the same numbers, and `convert to-hf` exports both checkpoints."""
    files = glue_data_files(tmp_path / "data", "sst2", num_rows=18)
    fine_tune = tmp_path / "sst2"
    result = run_train_recorded(
        "task=glue/sst2", f"init_from={runs['whole']}", *FSDP_ON_CPU, "trainer.precision=32-true", "logger=csv",
        "task.batch_size=4", "task.max_seq_length=32", "task.datamodule.num_workers=0", "trainer.max_epochs=1",
        *(f"task.data_files.{split}={path}" for split, path in files.items()), f"hydra.run.dir={fine_tune}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((fine_tune / "results.json").read_text())
    predictions = Path(results["predictions"][0]).read_text().splitlines()
    assert len(predictions) == 1 + 9  # a header, then every test sentence once (none from the padding batch)
    evaluated = run_script_forked(
        "evaluate", "task=glue/sst2", f"init_from={fine_tune}", "trainer=cpu", "logger=csv",
        "task.batch_size=4", "task.max_seq_length=32", "task.datamodule.num_workers=0",
        *(f"task.data_files.{split}={path}" for split, path in files.items()), f"hydra.run.dir={tmp_path / 'eval'}",
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scored = json.loads((tmp_path / "eval" / "results.json").read_text())["metrics"]
    assert scored["val/accuracy"] == results["metrics"]["val/accuracy"]  # the same 9 sentences, each once
    assert scored["val/loss"] == pytest.approx(results["metrics"]["val/loss"], abs=1e-5)
    for run, out in ((runs["whole"], tmp_path / "hf_pretrained"), (fine_tune, tmp_path / "hf_sst2")):
        assert convert(["to-hf", str(run), str(out)]) == 0
        assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
