"""bf16 mixed precision on CPU, as the GPU trainers run it: clipping, fused vs unfused AdamW, and the losses."""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from helpers.loss_recorder import global_norm
from helpers.runs import compose_config, cpu_twin, pretrain_overrides
from torch.distributed.fsdp import FullyShardedDataParallel

from lightbert.optim import clip_gradients
from lightbert.pretraining.module import PreTrainingModule
from lightbert.run.jobs import train


def recorded_norms(path: Path) -> list[tuple[float, float]]:
    return [tuple(map(float, line.split())) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_bf16_clipping_caps_the_global_norm_the_optimizer_applies(corpus_file, tmp_path, optimizer):
    norms = tmp_path / "norms.txt"
    overrides = [
        *cpu_twin("gpu"),  # bf16-mixed, gradient_clip_val 1.0, the default optimizer (fused AdamW) or LAMB
        *pretrain_overrides(corpus_file, optimizer, phases=1),
        "trainer.max_steps=6",
        "+callbacks.grad_norms._target_=helpers.loss_recorder.RecordGradNorms",
        f"+callbacks.grad_norms.path={norms}",
    ]
    train(compose_config(overrides, tmp_path / "run"))
    steps = recorded_norms(norms)
    assert len(steps) == 6
    assert all(raw > 1.5 for raw, _ in steps), steps  # measured: 3.7 to 5.3, so clipping has work to do
    assert all(applied == pytest.approx(1.0, abs=1e-4) for _, applied in steps), steps


def test_fp16_clipping_unscales_the_fused_adamw_gradients_first():
    """16-mixed scales the loss by 2^16 and the fused AdamW unscales inside its step, after clipping would have run
    on scaled gradients. (Lightning turns 16-mixed into bf16-mixed on CPU, so this runs the scaler by hand.)"""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    reference = copy.deepcopy(model)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    expected = torch.optim.AdamW(reference.parameters(), lr=0.1, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=scaler), strategy=SimpleNamespace(model=model))
    for _ in range(3):
        optimizer.zero_grad()
        scaler.scale(100 * F.mse_loss(model(x), y)).backward()
        clip_gradients(trainer, optimizer, 1.0, "norm")
        assert global_norm(p.grad for p in model.parameters()) == pytest.approx(1.0, abs=1e-5)
        scaler.step(optimizer)
        scaler.update()
        expected.zero_grad()
        (100 * F.mse_loss(reference(x), y)).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        expected.step()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_fsdp_clips_the_global_norm_of_the_shards():
    """Under FSDP each device holds a shard: the norm is the FSDP root's clip_grad_norm_ (it reduces across
    devices), never torch.nn.utils.clip_grad_norm_ on the local shard. FSDP cannot run on CPU: a stand-in root."""
    root = mock.create_autospec(FullyShardedDataParallel, instance=True)
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(scaler=None), strategy=SimpleNamespace(model=root))
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    with mock.patch("torch.nn.utils.clip_grad_norm_") as local_clip:
        clip_gradients(trainer, optimizer, 1.0, "norm")
    root.clip_grad_norm_.assert_called_once_with(1.0)
    local_clip.assert_not_called()


def final_weights(tmp_path: Path, corpus: Path, extra: list[str], name: str) -> dict[str, torch.Tensor]:
    overrides = [*pretrain_overrides(corpus, "adamw", phases=1), "trainer.max_steps=8", *extra]
    results = train(compose_config(overrides, tmp_path / name))
    return torch.load(results["last_checkpoint"], weights_only=True, map_location="cpu")["state_dict"]


def test_bf16_fused_and_unfused_adamw_end_on_the_same_weights(corpus_file, tmp_path):
    fused = final_weights(tmp_path, corpus_file, [*cpu_twin("gpu"), "optim.fused=true"], "fused")
    plain = final_weights(tmp_path, corpus_file, [*cpu_twin("gpu"), "optim.fused=false"], "foreach")
    assert fused.keys() == plain.keys()
    # 8 steps at lr 1e-4 move a weight by up to ~8e-4. The two kernels round differently in fp32, and the bf16
    # forward passes could amplify that; measured: 3.7e-9 at most.
    worst = max((fused[k].float() - plain[k].float()).abs().max().item() for k in fused)
    assert worst < 1e-5, worst


def losses(run: Path) -> list[float]:
    with (run / "metrics.csv").open() as f:
        return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


def test_bf16_pretraining_tracks_fp32(corpus_file, tmp_path):
    """Same seed, data and dropout: bf16 autocast changes the per-step losses by at most 0.01 over 30 steps."""
    common = [*pretrain_overrides(corpus_file, "adamw", phases=1), "trainer.max_steps=30", "optim.lr=1e-3"]
    common += ["trainer.log_every_n_steps=1", "trainer.val_check_interval=30"]
    train(compose_config([*cpu_twin("gpu"), *common], tmp_path / "bf16"))
    train(compose_config([*cpu_twin("gpu"), *common, "trainer.precision=32-true"], tmp_path / "fp32"))
    bf16, fp32 = losses(tmp_path / "bf16"), losses(tmp_path / "fp32")
    assert len(bf16) == len(fp32) == 30
    assert fp32[-1] < fp32[0] - 0.5  # the run learns, so tracking it means something
    differences = [abs(a - b) for a, b in zip(bf16, fp32, strict=True)]
    assert max(differences) < 0.01, differences  # measured: 7.7e-4 at most, on losses of 6.0 -> 5.15


def test_losses_and_their_softmax_stay_fp32_under_bf16_autocast(monkeypatch):
    seen = []
    original = torch.nn.functional.cross_entropy

    def recording(logits, *args, **kwargs):
        seen.append(logits.dtype)
        return original(logits, *args, **kwargs)

    monkeypatch.setattr("lightbert.pretraining.module.F.cross_entropy", recording)
    config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    module = PreTrainingModule({**config, "intermediate_size": 32}, {"lr": 1e-3})
    input_ids = torch.randint(5, 50, (2, 8))
    batch = {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": torch.ones_like(input_ids),
        "labels": torch.where(torch.arange(8) % 3 == 0, input_ids, -100),
        "next_sentence_label": torch.tensor([0, 1]),
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mlm_logits, _ = module(batch)
        out = module._step(batch)
    assert mlm_logits.dtype == torch.bfloat16  # the matmuls did run in bf16
    assert seen == [torch.float32, torch.float32]  # MLM and NSP cross-entropy (log-softmax) on fp32 logits
    assert out["loss"].dtype == torch.float32
