"""bf16 mixed precision on CPU, as the GPU trainers run it: clipping, fused vs unfused AdamW, and the losses."""

from __future__ import annotations

import copy
import csv
import multiprocessing
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing
import torch.nn.functional as F
from helpers.loss_recorder import global_norm
from helpers.runs import compose_config, cpu_twin, free_port, pretrain_overrides, run_settings, write_bert_corpus
from helpers.sharded_step import step

from lightbert import train
from lightbert.optim import MasterWeights, clip_gradients
from lightbert.tasks.pretraining.module import PreTrainingModule


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """conftest's corpus_file (the same 40 documents), once for the module: its tokenizer and examples are made once
    and cached (the cache knows a file by its path and times), not again for each test's own copy."""
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")


def recorded_norms(path: Path) -> list[tuple[float, float]]:
    return [tuple(map(float, line.split())) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_bf16_clipping_caps_the_global_norm_the_optimizer_applies(corpus, tmp_path, optimizer):
    norms = tmp_path / "norms.txt"
    overrides = [
        *cpu_twin("gpu"),  # bf16-mixed, gradient_clip_val 1.0, the default optimizer (fused AdamW) or LAMB
        *pretrain_overrides(corpus, optimizer, phases=1),
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


def forked_step(rank: int, *args) -> None:
    """`step` in a process forked from this one, on one thread, as a DataLoader worker runs: OpenMP's threads do not
    survive a fork, and a child that enters a parallel region after the parent used one waits for them forever
    (seen: LayerNorm's kernel in gomp_team_barrier_wait_end, once the file's in-process runs had gone first)."""
    torch.set_num_threads(1)
    step(rank, *args)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer", "checkpointing", "max_norm"),
    [("adamw", False, 0.01), ("lamb", True, 0.01), ("stableadamw", False, 0)],
)
def test_fsdp_clips_the_global_norm_of_the_shards(optimizer, checkpointing, max_norm):
    """Under FSDP each of 2 processes holds half of every weight and gradient (DTensors): the step, clipped by the
    global norm (reduced across the processes, not each shard's own) and taken by AdamW or LAMB (whose trust ratio
    needs each whole weight's norm), ends on the weights of the unsharded step on the whole batch; so it does with
    activation checkpointing (trainer.strategy.activation_checkpointing=true), and from another initialisation on
    the second process (every process starts from the first one's weights). StableAdamW (unclipped, as the modern
    recipe runs it) takes a second step on a gradient spike, whose update clipping needs the RMS over each whole
    weight, not over a shard."""
    with multiprocessing.Manager() as manager:
        results = manager.dict()
        # Forked from this process (torch and lightbert imported): the subject is the sharded step's arithmetic,
        # not the start of an interpreter, which spawn's two fresh ones cost about 10 s of CPU for.
        spike = optimizer == "stableadamw"
        arguments = (2, free_port(), optimizer, max_norm, checkpointing, results, spike)
        torch.multiprocessing.start_processes(forked_step, args=arguments, nprocs=2, start_method="fork")
        results = dict(results)
    if max_norm:
        assert results["norm"] > max_norm  # the clipping changes this step
    else:
        assert results["largest_rms"] > 1.2  # the spike's rate is clipped (measured 1.41; sqrt(2) at most at step 2)
    assert results["keys"] and results["tied"]  # the decoder still shares the word embeddings' weight
    assert results["checkpointed"] == (2 if checkpointing else 0)  # each block recomputed in the backward
    assert results["difference"] < 1e-6, results


def final_weights(tmp_path: Path, corpus: Path, extra: list[str], name: str) -> dict[str, torch.Tensor]:
    overrides = [*pretrain_overrides(corpus, "adamw", phases=1), "trainer.max_steps=8", *extra]
    results = train(compose_config(overrides, tmp_path / name))
    return torch.load(results["last_checkpoint"], weights_only=True, map_location="cpu")["state_dict"]


def test_bf16_fused_and_unfused_adamw_end_on_the_same_weights(corpus, tmp_path):
    fused = final_weights(tmp_path, corpus, [*cpu_twin("gpu"), "optim.fused=true"], "fused")
    plain = final_weights(tmp_path, corpus, [*cpu_twin("gpu"), "optim.fused=false"], "foreach")
    assert fused.keys() == plain.keys()
    # 8 steps at lr 1e-4 move a weight by up to ~8e-4. The two kernels round differently in fp32; where that flips
    # a bf16 rounding in a later forward pass, the gradients and so some weights differ a little more. Measured:
    # 3.7e-9 at most on one corpus, 1.4e-5 at most (0.08% of weights past 1e-6) on another. A different algorithm
    # (a missing bias correction, other betas) moves nearly every weight by more than 1e-4.
    diffs = torch.cat([(fused[k].float() - plain[k].float()).abs().flatten() for k in fused])
    assert diffs.max() < 1e-4 and (diffs > 1e-6).float().mean() < 0.01, (diffs.max(), (diffs > 1e-6).float().mean())


def losses(run: Path) -> list[float]:
    with (run / "metrics.csv").open() as f:
        return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


def tracking_overrides(corpus: Path) -> list[str]:
    """30 steps of the GPU trainer's twin at lr 1e-3, each step's loss logged: the runs the fp32 one is compared to."""
    common = [*pretrain_overrides(corpus, "adamw", phases=1), "trainer.max_steps=30", "optim.lr=1e-3"]
    return [*cpu_twin("gpu"), *common, "trainer.log_every_n_steps=1", "trainer.val_check_interval=30"]


@pytest.fixture(scope="module")
def fp32_reference(corpus, tmp_path_factory) -> tuple[Path, list[float]]:
    """The corpus and the per-step losses of its fp32 run: one reference for both bf16 precisions (the same
    command as each test's own run but for trainer.precision=32-true)."""
    where = tmp_path_factory.mktemp("fp32")
    train(compose_config([*tracking_overrides(corpus), "trainer.precision=32-true"], where / "run"))
    return corpus, losses(where / "run")


def test_bf16_pretraining_tracks_fp32(fp32_reference, tmp_path):
    """Same seed, data and dropout: bf16 autocast changes the per-step losses by at most 0.01 over 30 steps."""
    corpus, fp32 = fp32_reference
    train(compose_config(tracking_overrides(corpus), tmp_path / "bf16"))
    bf16 = losses(tmp_path / "bf16")
    assert len(bf16) == len(fp32) == 30
    assert fp32[-1] < fp32[0] - 0.5  # the run learns, so tracking it means something
    differences = [abs(a - b) for a, b in zip(bf16, fp32, strict=True)]
    assert max(differences) < 0.01, differences  # measured: 7.7e-4 at most, on losses of 6.0 -> 5.15


def test_a_bf16_model_with_fp32_master_weights_tracks_fp32(fp32_reference, tmp_path):
    """trainer.precision=bf16-true: the model in bf16 (no autocast casts), AdamW on fp32 master weights. Same seed,
    data and dropout as an fp32 run: the per-step losses stay close, and the checkpoint's weights are the fp32
    masters (what init_from and an export read), the same tensors the optimizer state holds for a resume."""
    corpus, fp32 = fp32_reference
    results = train(compose_config([*tracking_overrides(corpus), "trainer.precision=bf16-true"], tmp_path / "bf16"))
    bf16 = losses(tmp_path / "bf16")
    assert len(bf16) == len(fp32) == 30
    assert fp32[-1] < fp32[0] - 0.5
    differences = [abs(a - b) for a, b in zip(bf16, fp32, strict=True)]
    assert max(differences) < 0.02, differences  # measured: 1.6e-3 (bf16-mixed: 7.7e-4)
    val_loss = results["metrics"]["val/loss"]
    assert torch.tensor(val_loss).bfloat16().item() != val_loss  # summed in fp32, not in bf16 metric states
    checkpoint = torch.load(results["last_checkpoint"], weights_only=True)
    weights = checkpoint["state_dict"]
    assert {v.dtype for v in weights.values() if v.is_floating_point()} == {torch.float32}
    masters = [m for group in checkpoint["optimizer_states"][0]["masters"] for m in group]
    # The checkpoint keeps transformers' names (query, key, value); the model, and so its masters, one fused qkv.
    fused = [
        torch.cat([weights[name.replace(".query.", f".{part}.")] for part in ("query", "key", "value")])
        for name in weights
        if ".query." in name
    ]
    floating = [p for p in weights.values() if p.is_floating_point()]
    assert len(masters) == len(floating) - 1 - 2 * len(fused)  # the decoder is tied; three tensors made one
    # The word embeddings' master holds the rows padded to a multiple of 64 that the checkpoint leaves out.
    assert all(
        any(v.shape[1:] == m.shape[1:] and torch.equal(v, m[: len(v)]) for v in [*weights.values(), *fused] if v.dim())
        for m in masters
    )


def test_losses_and_their_softmax_stay_fp32_under_bf16_autocast(monkeypatch):
    seen = []
    original = torch.nn.functional.cross_entropy

    def recording(logits, *args, **kwargs):
        seen.append(logits.dtype)
        return original(logits, *args, **kwargs)

    monkeypatch.setattr("lightbert.tasks.pretraining.module.F.cross_entropy", recording)
    config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    module = PreTrainingModule({**config, "intermediate_size": 32}, {"lr": 1e-3, "warmup_ratio": 0.01})
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


def test_master_weights_step_the_fp32_weights_a_bf16_optimizer_would_round_away():
    """trainer.precision=bf16-true holds the model in bf16; MasterWeights steps fp32 copies with the same AdamW and
    rounds the model from them. Given the same gradients, its masters follow an fp32 AdamW exactly; a bf16 AdamW
    on the bf16 weights loses most of the updates (lr 1e-4 on weights near 1 is below bf16's resolution)."""
    torch.manual_seed(0)
    reference = torch.nn.Parameter((torch.randn(64, 32) + 1.0).bfloat16().float())  # a bf16 model's start
    model = torch.nn.Parameter(reference.detach().bfloat16())
    plain = torch.nn.Parameter(reference.detach().bfloat16())

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)

    expected = adamw([reference])
    optimizer = MasterWeights([{"params": [model], "weight_decay": 0.01}], adamw)
    rounding = adamw([plain])
    start = model.detach().clone()
    for _ in range(10):
        grad = torch.randn(64, 32).bfloat16()  # the gradients a bf16 backward gives
        reference.grad, model.grad, plain.grad = grad.float(), grad.clone(), grad.clone()
        for opt in (expected, optimizer, rounding):
            opt.step()
    torch.testing.assert_close(optimizer.masters[0][0], reference.detach(), atol=0, rtol=0)
    torch.testing.assert_close(model.detach(), reference.detach().bfloat16(), atol=0, rtol=0)
    assert model.dtype == torch.bfloat16 and model.grad is not None  # Lightning zeroes the model's gradients
    moved = (optimizer.masters[0][0] != start.float()).float().mean()
    stuck = (plain == start).float().mean()
    assert moved == 1 and stuck > 0.95, (moved, stuck)  # every master moved; a bf16 AdamW left over 95% where they were


def test_master_weights_resume_from_their_state_dict():
    torch.manual_seed(0)

    def make(init):
        weight = torch.nn.Parameter(init.bfloat16())
        optimizer = MasterWeights([{"params": [weight]}], lambda g: torch.optim.AdamW(g, lr=1e-3))
        return weight, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))

    weight, optimizer, schedule = make(torch.randn(8, 4))
    grads = [torch.randn(8, 4).bfloat16() for _ in range(6)]
    states = []
    for grad in grads:
        weight.grad = grad.clone()
        optimizer.step()
        schedule.step()
        states.append((copy.deepcopy(optimizer.state_dict()), copy.deepcopy(schedule.state_dict())))
    resumed_weight, resumed, resumed_schedule = make(torch.zeros(8, 4))  # as Lightning restores: fresh, then loaded
    with torch.no_grad():
        resumed_weight.copy_(optimizer.masters[0][0] * 0)  # wrong on purpose: the state dict must bring them back
    resumed.load_state_dict(states[2][0])
    resumed_schedule.load_state_dict(states[2][1])
    with torch.no_grad():
        resumed_weight.copy_(resumed.masters[0][0])  # the checkpoint's weights (the masters, rounded on load)
    for grad in grads[3:]:
        resumed_weight.grad = grad.clone()
        resumed.step()
        resumed_schedule.step()
    assert resumed.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    torch.testing.assert_close(resumed.masters[0][0], optimizer.masters[0][0], atol=0, rtol=0)
    torch.testing.assert_close(resumed_weight, weight, atol=0, rtol=0)


def test_accuracies_are_fp32_under_a_bf16_models_forward():
    """Lightning's bf16-true runs the step with bf16 as the default dtype, which integer over integer takes: an
    accuracy of 100/300 would be logged as bf16's 0.333984375."""
    from lightning.pytorch.plugins.precision import HalfPrecision

    from lightbert.tasks.pretraining.module import accuracy

    logits = torch.zeros(300, 4)
    logits[:100, 1] = 1.0
    labels = torch.ones(300, dtype=torch.long)
    with HalfPrecision("bf16-true").forward_context():
        got = accuracy(logits, labels)
    assert got.dtype == torch.float32 and got.item() == pytest.approx(1 / 3, abs=1e-7)


def test_bf16_true_master_weights_start_from_the_fp32_weights():
    """Lightning casts the model to bf16 before the optimiser is built: masters copied then would start from
    bf16-rounded weights, losing what an fp32 checkpoint (init_from) holds below bf16's 8 bits of mantissa."""
    import lightning as L
    from test_packing import CONFIG, masking, sentence_pairs
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    fp32 = {name: p.detach().clone() for name, p in module.model.named_parameters()}
    assert any(not torch.equal(w, w.bfloat16().float()) for w in fp32.values())  # bf16 would round them
    seen = {}

    class Masters(L.Callback):
        def on_train_start(self, trainer, pl_module):
            masters = trainer.optimizers[0].master_of()
            for name, p in pl_module.model.named_parameters():
                assert p.dtype == torch.bfloat16
                seen[name] = masters[id(p)].clone()

    trainer = L.Trainer(
        accelerator="cpu", precision="bf16-true", max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[Masters()],
    )  # fmt: skip
    trainer.fit(module, DataLoader(sentence_pairs(8), batch_size=4, collate_fn=masking()))
    assert seen.keys() == fp32.keys()
    assert all(torch.equal(seen[name], fp32[name]) for name in fp32)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.precision=16-true"], "trainer.precision=16-true holds the model in fp16 with no loss scaling"),
        (
            ["trainer.precision=bf16-true", "trainer.accumulate_grad_batches=8"],
            "trainer.precision=bf16-true adds up gradients in bf16, which loses precision over "
            "trainer.accumulate_grad_batches=8: set trainer.accumulate_grad_batches=1",
        ),
    ],
)
def test_half_models_that_would_lose_their_gradients_are_refused(tmp_path, overrides, message):
    from lightbert.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        run_settings(compose_config(["task=pretrain", *cpu_twin("gpu"), *overrides], tmp_path))
    assert message in str(refused.value) and "\n" not in str(refused.value)
    run_settings(compose_config(["task=pretrain", *cpu_twin("gpu"), "trainer.precision=bf16-true"], tmp_path / "ok"))
