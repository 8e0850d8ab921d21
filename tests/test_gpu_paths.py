"""What the GPU-only paths do that a CPU can check: the FSDP strategy trainer=fsdp builds, CUDA RNG states in
checkpoints, several nodes' world size. (Clipping under FSDP and fp16: tests/test_precision.py; FSDP on real
processes: tests/test_fsdp.py.)"""

from __future__ import annotations

from unittest import mock

import lightning as L
import pytest
import torch

from lightbert.errors import ConfigError
from lightbert.model import BertConfig
from lightbert.plugins.checkpointing import rng_states, set_rng_states
from lightbert.tasks.pretraining.resumable import StepSampler


def test_fsdp_is_fsdp2_with_full_state_checkpoints_and_refuses_what_it_does_not_shard():
    """trainer=fsdp builds torch's FSDP2 through Lightning's ModelParallelStrategy, on a machine without CUDA too
    (gloo); its sharding on real processes: tests/test_fsdp.py."""
    from lightbert.plugins.strategies import FullyShardedStrategy, fsdp_strategy

    strategy = fsdp_strategy()
    assert isinstance(strategy, FullyShardedStrategy) and strategy.reshard_after_forward
    # One full checkpoint file, written through the trainer's checkpoint IO (AtomicCheckpointIO) by rank 0.
    assert strategy._save_distributed_checkpoint is False
    assert not fsdp_strategy("SHARD_GRAD_OP", activation_checkpointing=True).reshard_after_forward
    with pytest.raises(ConfigError, match=r"sharding_strategy=NO_SHARD is not one of FULL_SHARD, SHARD_GRAD_OP; .*ddp"):
        fsdp_strategy("NO_SHARD")


def test_cuda_rng_states_go_into_checkpoints_and_back(monkeypatch, tmp_path):
    """ResumableRNG saves every CUDA generator's state with the CPU ones; they load with weights_only=True."""
    cuda_states = [torch.randint(0, 255, (16,), dtype=torch.uint8) for _ in range(2)]
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: cuda_states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.extend)
    torch.save({"rng_states": [rng_states()]}, tmp_path / "c.ckpt")
    states = torch.load(tmp_path / "c.ckpt", weights_only=True)["rng_states"][0]
    expected_cpu = torch.get_rng_state()
    torch.rand(3)
    set_rng_states(states)
    assert torch.equal(torch.get_rng_state(), expected_cpu)
    assert [s.tolist() for s in restored] == [s.tolist() for s in cuda_states]


def test_several_nodes_shard_the_steps_over_every_device():
    """trainer.num_nodes multiplies the world size the step sampler shards over (2 nodes x 2 devices = 4)."""
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", logger=False)
    assert trainer.world_size == 4
    samplers = [StepSampler(64, batch_size=4, seed=1, rank=r, world_size=trainer.world_size) for r in range(4)]
    order = [list(iter(s)) for s in samplers]
    seen = [i for rank in order for _, i in rank]
    assert len(seen) == len(set(seen)) == 64  # each example once per epoch, on one device
    assert all(len(rank) == 16 for rank in order)


def test_fp32_matmuls_use_tf32_on_cuda_and_the_run_line_says_so(tmp_path):
    from helpers.runs import compose_config, run_settings

    from lightbert.run.run_line import describe_run
    from lightbert.run.speed import set_fp32_matmuls

    settings = run_settings(compose_config(["trainer=gpu"], tmp_path))
    model = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4)
    was = torch.get_float32_matmul_precision()
    try:
        with mock.patch("torch.cuda.is_available", return_value=False):
            set_fp32_matmuls(settings.speed, settings.trainer)  # no CUDA: nothing changes
            assert "matmuls" not in describe_run(settings, model)
        assert torch.get_float32_matmul_precision() == was
        settings = run_settings(compose_config(["trainer=gpu"], tmp_path))  # on_cuda is worked out once
        with (
            mock.patch("torch.cuda.is_available", return_value=True),
            mock.patch("torch.cuda.device_count", return_value=1),
        ):
            set_fp32_matmuls(settings.speed, settings.trainer)
            line = describe_run(settings, model)
        assert torch.get_float32_matmul_precision() == "high"
        assert "bf16-mixed (TF32 matmuls)" in line
    finally:
        torch.set_float32_matmul_precision(was)


def test_the_compile_mode_reaches_torch_compile(tmp_path):
    """speed.compile_mode=reduce-overhead (CUDA graphs) is what the model's torch.compile is given; default passes
    no mode. The losses are compiled too, never in CUDA graphs (a replay would overwrite the logged losses)."""
    from helpers.runs import compose_config, run_settings

    from lightbert.run.speed import apply_speed_switches
    from lightbert.run.speed_settings import SpeedSettings
    from lightbert.tasks.pretraining.module import PreTrainingModule, pretraining_losses

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    for mode, given in (("reduce-overhead", "reduce-overhead"), ("default", None)):
        module = PreTrainingModule(config.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
        with mock.patch.object(module.model, "compile") as compile_, mock.patch("torch.compile") as compile_losses:
            trainer = run_settings(compose_config(["trainer=cpu"], tmp_path)).trainer
            apply_speed_switches(
                module, SpeedSettings(compile=True, compile_mode=mode), trainer, packing=False, compiles=True
            )
        compile_.assert_called_once_with(mode=given, backend="inductor")
        compile_losses.assert_called_once_with(pretraining_losses, backend="inductor")
        assert module.losses is compile_losses.return_value


@pytest.mark.parametrize(
    ("overrides", "length"),
    [
        (["task=glue/sst2", "init_from=x", "trainer=cpu"], "3 epochs or 200 steps"),  # whichever comes first
        (["task=glue/sst2", "init_from=x", "trainer=cpu", "trainer.max_epochs=0"], "0 epochs or 200 steps"),
        (["task=pretrain", "trainer=cpu", "trainer.max_steps=7"], "7 steps"),
    ],
)
def test_the_run_line_gives_every_limit_that_can_end_the_run(tmp_path, overrides, length):
    from helpers.runs import compose_config, run_settings

    from lightbert.run.run_line import describe_run

    line = describe_run(
        run_settings(compose_config(overrides, tmp_path)),
        BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2),
    )
    assert f", {length}, batch" in line
