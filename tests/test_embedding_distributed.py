"""task=embedding across processes: the contrastive loss's negatives gathered from every process (with their
gradient), GradCache (the batch embedded in mini-batches, dropout replayed) alone and under DDP, and a 2-process
`trainer=ddp` run with GradCache whose retrieval scores are the whole validation split's. Real gloo processes on CPU;
each comparison has its control (gather=False, no RNG replay, no DDP), which must differ."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.multiprocessing
from helpers import embedding_ddp
from helpers.embedding_ddp import (
    Step,
    global_batch,
    gradients,
    largest_difference,
    make_model,
    reference,
)
from helpers.embedding_files import WORDS, pair_files
from helpers.models import write_hf_bert
from helpers.runs import free_port, run_script_forked, run_train_forked

from lightbert.tasks.embedding.loss import GradCache

TOLERANCE = 1e-6  # measured: losses equal to the last bit, gradients within 3e-7 (fp32 sums in another order)


def on_two_processes(job) -> dict:
    """`job(rank, world, results)` of helpers.embedding_ddp in 2 gloo processes forked from this one; their results."""
    with multiprocessing.Manager() as manager:
        results = manager.dict()
        arguments = (2, free_port(), job, results)
        torch.multiprocessing.start_processes(embedding_ddp.worker, args=arguments, nprocs=2, start_method="fork")
        return dict(results)


def test_gathered_negatives_give_each_process_the_global_batchs_loss_and_gradient():
    """Each of 2 processes embeds its half of the global batch; with gather=True the mean of their losses is the
    one-process loss on the whole batch, and their gradients averaged (as DDP averages them) the one-process
    gradient: with and without hard negatives, one-way and symmetric. With gather=False each process's negatives are
    its own rows only, a different (smaller) loss."""
    results = on_two_processes(embedding_ddp.gathered_negatives)
    assert len(results) == 8  # 2 processes x 4 cases
    for (rank, negatives, symmetric), case in results.items():
        where = f"rank {rank}, {negatives} hard negative(s), symmetric={symmetric}: {case}"
        assert case["loss"] == pytest.approx(case["expected_loss"], abs=TOLERANCE), where
        assert case["gradient"] < TOLERANCE, where
        assert case["not_gathered_loss"] < case["expected_loss"] - 0.3, where  # measured 0.47 to 0.73 lower


@pytest.mark.parametrize(("mini_batch_size", "negatives"), [(2, 1), (5, 1), (3, 0)])
def test_grad_cache_equals_one_graph_over_the_batch_with_dropout_replayed(mini_batch_size, negatives):
    """One process, dropout on: GradCache's loss and every parameter's gradient equal those of one graph over the
    batch's texts embedded in the same mini-batches from the same seed (the same dropout masks), whether or not the
    mini-batch size divides the batch (12 or 8 texts); a backward from half the loss (Lightning's accumulation)
    halves them. Without the RNG replay in the backward pass the dropout masks differ, and so do the gradients."""
    symmetric = negatives == 0
    ((ids, mask),) = global_batch(1, negatives)
    expected_loss, expected = reference(make_model(0.1), [(ids, mask)], symmetric, mini_batch_size, seeds=[7])

    model = make_model(0.1)
    torch.manual_seed(7)
    loss = Step(model, mini_batch_size, symmetric)(ids, mask)
    (loss / 2).backward()
    halved = {name: g * 2 for name, g in gradients(model).items()}
    assert loss.item() == pytest.approx(expected_loss, abs=TOLERANCE)
    assert largest_difference(halved, expected) < TOLERANCE

    class NoReplay(GradCache):
        def _backward(self, scale, slices, states, gradient, embed, autocast):
            super()._backward(scale, slices, [None] * len(states), gradient, embed, autocast)

    model = make_model(0.1)
    step = Step(model, mini_batch_size, symmetric)
    step.grad_cache = NoReplay(model.parameters, mini_batch_size)
    torch.manual_seed(7)
    step(ids, mask).backward()
    assert largest_difference(gradients(model), expected) > 1e-3  # measured 0.44 and more


def test_grad_cache_without_dropout_equals_the_whole_batch_in_one_forward():
    """Without dropout the mini-batches change nothing: GradCache's loss and gradients equal one forward pass of the
    whole batch (4 pairs and their hard negatives, 12 texts, mini-batches of 5)."""
    ((ids, mask),) = global_batch(1, 1)
    expected_loss, expected = reference(make_model(0.0), [(ids, mask)], symmetric=False)
    model = make_model(0.0)
    loss = Step(model, 5, symmetric=False)(ids, mask)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=TOLERANCE)
    assert largest_difference(gradients(model), expected) < TOLERANCE


def test_grad_cache_under_ddp_leaves_the_global_batchs_gradients():
    """GradCache inside DistributedDataParallel on 2 processes, dropout on, gathered negatives: after each of two
    steps every process holds the one-process gradient of the whole global batch, for a mini-batch size that divides
    each process's 12 texts and one that does not. The surrogate backward reaches DDP's reducer: the same step
    outside DDP leaves each process its own gradient, far from it. gather=False under DDP is another loss."""
    results = on_two_processes(embedding_ddp.grad_cache_under_ddp)
    for rank in (0, 1):
        for mini_batch_size in (2, 5):
            for step in (0, 1):
                case = results[(rank, mini_batch_size, True, step)]
                where = f"rank {rank}, mini-batches of {mini_batch_size}, step {step}: {case}"
                assert case["loss"] == pytest.approx(case["expected_loss"], abs=TOLERANCE), where
                assert case["gradient"] < TOLERANCE, where
            assert results[(rank, mini_batch_size, True, "alone")] > 0.1  # measured 0.45 and more
        for step in (0, 1):
            assert results[(rank, 2, False, step)]["gradient"] > 0.1  # measured 0.2


VALIDATION_ROWS = 23  # odd: a distributed sampler would repeat a row to give 2 devices as many


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedding_ddp")
    data = pair_files(root / "data", train=64, validation=VALIDATION_ROWS, negatives=1)
    return {"root": root, "bert": write_hf_bert(root / "bert", words=WORDS), **{k: Path(v) for k, v in data.items()}}


@pytest.mark.slow
def test_ddp_with_grad_cache_trains_and_scores_the_whole_validation_split_once(files, tmp_path):
    """`trainer=ddp` on 2 CPU processes (bf16-mixed, as on GPUs) with task.mini_batch_size: exit 0, retrieval scores
    logged, and they are those of a 1-process src/evaluate.py of the same checkpoint, bf16-mixed too (each of the 23
    validation rows once: the devices' shares gathered, no row repeated)."""
    run_dir = tmp_path / "run"
    common = ["task=embedding", "logger=csv", f"task.data_files.validation={files['validation']}"]
    run = run_train_forked(
        *common,
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        f"init_from={files['bert']}",
        f"task.data_files.train={files['train']}",
        "task.batch_size=8",  # 16 pairs a step, 4 steps
        "task.mini_batch_size=5",  # 24 texts per device: 5 mini-batches, the last of 4
        "optim.lr=1e-3",
        f"hydra.run.dir={run_dir}",
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "2 x cpu, strategy ddp, bf16-mixed" in run.stdout
    assert "FutureWarning" not in run.stderr  # torch's deprecation of the gathering all_gather is not the user's
    results = json.loads((run_dir / "results.json").read_text())
    scores = {k: v for k, v in results["best_metrics"].items() if k != "val/loss"}
    assert sorted(scores) == ["val/mrr_at_10", "val/ndcg_at_10", "val/recall_at_1", "val/recall_at_10"]
    assert f"validation at step {results['global_step']}: " in run.stdout
    for name in ("val/recall_at_1", "val/recall_at_10"):  # a fraction of the 23 rows
        assert scores[name] * VALIDATION_ROWS == pytest.approx(round(scores[name] * VALIDATION_ROWS), abs=1e-4)

    evaluated = run_script_forked(
        "evaluate",
        *common,
        "trainer=cpu",
        "trainer.precision=bf16-mixed",
        f"init_from={run_dir}",
        f"hydra.run.dir={tmp_path / 'eval'}",
    )
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    alone = json.loads((tmp_path / "eval" / "results.json").read_text())["metrics"]
    for name, value in scores.items():
        assert alone[name] == pytest.approx(value, abs=1e-6), (name, alone, scores)


@pytest.mark.parametrize(
    ("trainer", "strategy"),
    [(["trainer=fsdp"], "fsdp"), (["trainer=ddp", "trainer.strategy=ddp_find_unused_parameters_true"], None)],
)
def test_grad_cache_under_fsdp_is_refused_in_one_line_before_anything_is_written(files, tmp_path, trainer, strategy):
    strategy = strategy or trainer[-1].split("=")[1]
    run_dir = tmp_path / "run"
    run = run_train_forked(
        "task=embedding",
        *trainer,
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "logger=csv",
        f"init_from={files['bert']}",
        f"task.data_files.train={files['train']}",
        f"task.data_files.validation={files['validation']}",
        "task.mini_batch_size=4",
        f"hydra.run.dir={run_dir}",
    )
    errors = [line for line in run.stderr.splitlines() if line.startswith("lightbert: error:")]
    assert run.returncode == 2 and len(errors) == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stdout + run.stderr
    assert f"task.mini_batch_size (GradCache) does not run under trainer.strategy={strategy}" in errors[0]
    assert not run_dir.exists() or not any(run_dir.iterdir())
