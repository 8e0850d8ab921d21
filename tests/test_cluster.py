"""Where runs run: the SLURM config, submitit's local executor, DDP inside a multirun, FSDP without a GPU."""

import json
import pickle

import numpy as np
import pytest
import torch
from helpers.runs import run_train_forked, run_train_script, write_bert_corpus

from lightbert.cluster import processes
from lightbert.plugins.checkpointing import AtomicCheckpointIO
from lightbert.tasks.pretraining.resumable import SeededPermutation, StepSampler

TINY_RUN = [
    "model=bert_tiny",
    "trainer=cpu",
    "task.batch_size=4",
    "task.max_seq_length=64",
    "task.datamodule.vocab_size=400",
    "task.datamodule.num_workers=0",
    "logger=csv",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
]


def test_slurm_config_shows_the_submitit_settings():
    result = run_train_script(
        "cluster=slurm", "trainer=ddp8", "trainer.num_nodes=4", "hydra.launcher.partition=gpu", "--cfg", "hydra"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "_target_: hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in out
    for line in (
        "nodes: ${trainer.num_nodes}",
        "tasks_per_node: ${trainer.devices}",
        "gpus_per_node: ${trainer.devices}",
        "partition: gpu",
        "account: null",
        "timeout_min: 4320",
        "max_num_timeout: 20",
    ):
        assert line in out, line
    job = run_train_script("cluster=slurm", "trainer=ddp8", "trainer.num_nodes=4", "--cfg", "job", "--resolve")
    assert "resume: true" in job.stdout and "auto_requeue: false" in job.stdout  # one requeue owner: submitit


@pytest.mark.slow
def test_ddp_inside_a_multirun_keeps_each_jobs_processes_in_its_directory(tmp_path):
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=12)
    sweep = tmp_path / "sweep"
    result = run_train_script(
        "-m",
        *TINY_RUN,
        "corpus=text",
        f"corpus.paths=[{corpus}]",
        "trainer.devices=2",
        "trainer.strategy=ddp",
        "seed=1,2",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    for job in jobs:
        assert json.loads((sweep / job / "results.json").read_text())["global_step"] == 3
        assert (sweep / job / "train_ddp_process_1.log").is_file()  # each job's rank 1 ran in its directory
    assert len(list(sweep.rglob("results.json"))) == 2
    # Each job launched its own rank 1, which ran that job alone (no second sweep), with the job's seed.
    assert result.stdout.count("Launching 2 jobs") == 1
    assert [line for line in result.stderr.splitlines() if "Seed set to" in line] == [
        "INFO: Seed set to 1", "INFO: [rank: 1] Seed set to 1", "INFO: Seed set to 2", "INFO: [rank: 1] Seed set to 2"
    ]  # fmt: skip


def test_a_multirun_jobs_ddp_process_runs_that_job_alone(monkeypatch):
    lightning_argv = ["-m", "seed=1,2", "hydra.sweep.dir=/s", 'hydra.run.dir="outputs/x"',
                      "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]  # fmt: skip
    job = {"overrides": ["model=bert_tiny", "seed=2"], "output_dir": "/s/1"}
    monkeypatch.setenv(processes.DDP_JOB, json.dumps(job))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert processes.ddp_child_argv(lightning_argv) == [
        "model=bert_tiny",
        "seed=2",
        'hydra.run.dir="/s/1"',
        "hydra.mode=RUN",
        "hydra.job.name=train_ddp_process_1",
        "hydra.output_subdir=null",
    ]  # fmt: skip (hydra.mode=RUN: a job of sweep=paper_grid or experiment=glue_benchmark names a multirun config)
    monkeypatch.setenv("LOCAL_RANK", "0")  # the job's own process, or a command line with no sweep: unchanged
    assert processes.ddp_child_argv(lightning_argv) == lightning_argv
    monkeypatch.setenv("LOCAL_RANK", "1")  # a multirun that its config makes has no -m: still this job alone
    assert processes.ddp_child_argv(["experiment=glue_benchmark"])[:3] == [
        "model=bert_tiny",
        "seed=2",
        'hydra.run.dir="/s/1"',
    ]
    monkeypatch.delenv(processes.DDP_JOB)  # a single run's DDP process: unchanged
    assert processes.ddp_child_argv(["seed=2"]) == ["seed=2"]


def test_fsdp_without_a_gpu_says_how_to_run_it_on_cpu():
    """trainer=fsdp asks for GPUs; FSDP2 also runs on CPU processes (gloo), which the message offers."""
    result = run_train_forked("trainer=fsdp", "logger=csv", "trainer.max_steps=1")
    assert result.returncode == 2
    assert "trainer=fsdp needs a CUDA GPU" in result.stderr
    assert "trainer.accelerator=cpu trainer.devices=2" in result.stderr and "Traceback" not in result.stderr


def test_step_sampler_gives_every_device_its_own_batches_and_resumes_at_the_step():
    def batches(sampler):
        pairs = list(iter(sampler))
        return [pairs[i : i + 4] for i in range(0, len(pairs), 4)]

    one = StepSampler(50, batch_size=4, seed=3, accumulate=2)  # 6 steps of 2 x 4 per epoch; 2 examples dropped
    ranks = [StepSampler(50, batch_size=4, seed=3, rank=r, world_size=2) for r in (0, 1)]
    epoch = batches(one)
    assert len(epoch) == 12 and len({i for batch in epoch for _, i in batch}) == 48  # no example twice
    by_rank = [batches(s) for s in ranks]
    # Step k: one device's micro-batches 2k and 2k+1 are device 0's and device 1's batch k.
    assert [b for k in range(6) for b in (by_rank[0][k], by_rank[1][k])] == epoch
    next_epoch = batches(one)
    assert next_epoch[0][0][0] == 1 and [i for _, i in next_epoch[0]] != [i for _, i in epoch[0]]  # a new order
    resumed = StepSampler(50, batch_size=4, seed=3, accumulate=2, start_step=4)
    assert batches(resumed) == epoch[8:]  # from step 5: micro-batches 8-11
    fresh = StepSampler(50, batch_size=4, seed=3, accumulate=2)
    second_epoch = (batches(fresh), batches(fresh))[1]
    assert batches(StepSampler(50, batch_size=4, seed=3, accumulate=2, start_step=6)) == second_epoch


def test_a_crash_while_saving_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    import lightning.fabric.plugins.io.torch_io as torch_io
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    def killed_mid_write(checkpoint, path):  # what a SIGKILL half way through the file write leaves
        with open(path, "wb") as out:
            out.write(b"half a checkpoint")
        raise KeyboardInterrupt("killed while writing")

    for io, survives in ((AtomicCheckpointIO(), True), (TorchCheckpointIO(), False)):
        path = tmp_path / f"last-{survives}.ckpt"
        io.save_checkpoint({"global_step": 8}, path)
        with monkeypatch.context() as patch:
            patch.setattr(torch_io, "_atomic_save", killed_mid_write)
            with pytest.raises(KeyboardInterrupt):
                io.save_checkpoint({"global_step": 12}, path)
        if survives:
            assert torch.load(path, weights_only=True) == {"global_step": 8}
        else:  # Lightning's own writes in place: the latest checkpoint is gone
            with pytest.raises((KeyError, EOFError, RuntimeError, pickle.UnpicklingError)):
                torch.load(path, weights_only=True)


@pytest.mark.slow
def test_a_two_device_sweep_runs_through_submitits_local_executor(tmp_path):
    """Each job's two processes are submitit's tasks (tasks_per_node = trainer.devices), as srun's are on SLURM: one
    of them records the run, both train it."""
    corpus = write_bert_corpus(tmp_path / "corpus.txt", num_documents=12)
    sweep = tmp_path / "sweep"
    result = run_train_forked(  # the sweep's own process forked: submitit's tasks are fresh interpreters
        "-m", "cluster=submitit_local", *TINY_RUN, "corpus=text", f"corpus.paths=[{corpus}]", "trainer.devices=2",
        "trainer.strategy=ddp", "seed=1,2", f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert json.loads((sweep / job / "results.json").read_text())["global_step"] == 3
        line = next(x for x in (sweep / job / "train.log").read_text().splitlines() if "strategy ddp" in x)
        assert "2 x cpu" in line, line
    logs = sorted(p.name for p in (sweep / ".submitit").rglob("*_log.err"))
    assert len(logs) == 4, logs  # two jobs of two tasks


def test_the_sample_order_is_a_seeded_bijection_computed_per_batch():
    for n in (1, 2, 3, 5, 17, 1000, 4097):
        values = SeededPermutation(n, seed=3, epoch=0)(np.arange(n))
        assert sorted(values.tolist()) == list(range(n))  # every example once
    order = lambda seed, epoch: SeededPermutation(1000, seed, epoch)(np.arange(1000)).tolist()  # noqa: E731
    assert order(3, 0) == order(3, 0) and order(3, 0) != order(3, 1) != order(4, 0)
    assert order(3, 0) != list(range(1000))
    # Shuffled, not shifted: where position 0 goes is spread evenly over 10 values across 2000 seeds.
    firsts = np.bincount([SeededPermutation(10, seed, 0)(np.arange(1))[0] for seed in range(2000)], minlength=10)
    assert firsts.min() > 140 and firsts.max() < 260
    # A trillion examples: nothing of the corpus's size is built (a randperm would need 8 TB).
    sampler = StepSampler(10**12, batch_size=4, seed=3, rank=1, world_size=2, start_step=10**9)
    epoch, index = next(iter(sampler))
    assert epoch == 0 and 0 <= index < 10**12
