"""speed.fp8=true: torchao's Float8Linear for the encoder's matmuls. On CPU torchao emulates the float8 kernels, so
these tests check what the switch converts, that checkpoints stay plain, and that the losses track fp32; what it
pays on an H100 is for bench/pretrain_step.py on a GPU (never measured here)."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
import torch
from helpers.cuda_rules import ScaledMatmuls
from helpers.runs import compose_config, pretrain_overrides
from torch import nn

from lightbert import train
from lightbert.errors import UserError
from lightbert.model import BertConfig
from lightbert.model.bert import BertForSequenceClassification
from lightbert.model.fp8 import convert_to_fp8, import_torchao

pytest.importorskip("torchao")  # the dev extra has it; a GPU machine's image may not (skips, not an error)
Float8Linear = import_torchao().float8_linear.Float8Linear

CONFIG = BertConfig(
    vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    max_position_embeddings=32,
)  # fmt: skip


def test_fp8_converts_the_encoder_linears_and_keeps_the_state_dict():
    torch.manual_seed(0)
    plain = BertForSequenceClassification(CONFIG, num_labels=3)
    converted = BertForSequenceClassification(CONFIG, num_labels=3)
    converted.load_state_dict(plain.state_dict())
    assert convert_to_fp8(converted) == 2 * 4 + 1  # per layer the fused qkv, attention output, two feed-forward; pooler
    kinds = {name: type(module) for name, module in converted.named_modules() if isinstance(module, nn.Linear)}
    assert kinds.pop("classifier") is nn.Linear  # 3 outputs: not a size the kernels take
    assert set(kinds.values()) == {Float8Linear}
    # The same parameter names, shapes and values: a checkpoint trained with fp8 loads into a plain model.
    state = converted.state_dict()
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in plain.state_dict().items()}
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())
    # The matmuls do run in float8: the logits move by float8's rounding, not more.
    input_ids = torch.randint(5, 300, (4, 16))
    plain.eval(), converted.eval()
    want, got = plain(input_ids), converted(input_ids)
    assert not torch.equal(got, want)
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)
    # A frozen encoder (the feature-based tasks) trains nothing: its features are computed as they were.
    frozen = BertForSequenceClassification(CONFIG, num_labels=3)
    frozen.bert.requires_grad_(False)
    assert convert_to_fp8(frozen) == 0


def test_fp8_without_torchao_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(UserError, match=r"speed\.fp8=true needs lightbert's fp8 extra.*pip install -e '\.\[fp8\]'"):
        import_torchao()


def losses(run: Path) -> list[float]:
    with (run / "metrics.csv").open() as f:
        return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


@pytest.mark.slow  # two end-to-end runs, one of emulated float8
def test_fp8_pretraining_tracks_fp32(corpus_file, tmp_path, caplog):
    """Same seed, data and dropout through src/train.py's path: float8 matmuls change the per-step losses a little
    over 10 steps (about as much as bf16 does), and the run line says they ran."""
    common = [*pretrain_overrides(corpus_file, "adamw", phases=1), "trainer.max_steps=10", "optim.lr=1e-2"]
    # Emulated float8 matmuls cost about 1 s a GFLOP on CPU: a narrower bert_tiny keeps the fp8 run to seconds (H=32:
    # 4 CPU-s on one thread, 13 at H=64). Its lr learns as much in 10 steps (a 0.8 drop; 0.7 at H=64 and 3e-3), and
    # float8 moves its losses by at most 0.027 (0.008 there).
    common += ["model.hidden_size=32", "model.intermediate_size=64"]
    common += ["trainer.log_every_n_steps=1", "trainer.val_check_interval=10"]
    with caplog.at_level("INFO", logger="lightbert"):
        train(compose_config([*common, "speed.fp8=true"], tmp_path / "fp8"))
    assert "fp8 matmuls (emulated on CPU: slower than fp32)" in caplog.text
    train(compose_config(common, tmp_path / "fp32"))
    fp8, fp32 = losses(tmp_path / "fp8"), losses(tmp_path / "fp32")
    assert len(fp8) == len(fp32) == 10
    assert min(fp32[-3:]) < fp32[0] - 0.5  # the run learns, so tracking it means something
    differences = [abs(a - b) for a, b in zip(fp8, fp32, strict=True)]
    assert 0 < max(differences) < 0.05, differences


def fp8_step_matmuls(batch_of_lengths: list[int], unpad: str) -> ScaledMatmuls:
    """Every _scaled_mm of one fp8 training step (forward and backward) of a fine-tuning model on CPU, over
    sequences of these lengths."""
    torch.manual_seed(0)
    net = BertForSequenceClassification(CONFIG, num_labels=3).train()
    net.bert.set_unpadding(unpad)
    convert_to_fp8(net)
    width = max(batch_of_lengths)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(batch_of_lengths)[:, None]).long()
    input_ids = torch.randint(5, 300, attention_mask.shape) * attention_mask
    with ScaledMatmuls() as calls:
        net(input_ids, attention_mask=attention_mask).float().sum().backward()
    return calls


@pytest.mark.parametrize(
    ("lengths", "unpad"), [([13, 7, 16, 9], "groups"), ([13, 7, 16, 9], "varlen"), ([11] * 3, "off")]
)
def test_every_fp8_matmul_of_a_step_is_one_a_cuda_gpu_takes(lengths, unpad):
    """The weight gradient `grad_output.t() @ input` contracts over the token count (here 45 real tokens, or 3 x 11
    padded ones): CUDA's _scaled_mm wants that a multiple of 16, where the CPU kernel takes anything. Every call the
    step makes is replayed on fake CUDA tensors, through CUDA's own checks (torch's meta kernel)."""
    calls = fp8_step_matmuls(lengths, unpad)
    assert (
        len(calls.calls) == 3 * 9
    )  # forward, input and weight gradients of each converted Linear (fused QKV: 4 a layer, 2 layers, the head)
    assert calls.refused() == []


def test_every_fp8_matmul_of_a_packed_pretraining_step_is_one_a_cuda_gpu_takes():
    """Packed rows: the MLM transform runs over R x P prediction slots (R rows varies by batch), the pooler over
    R x K example slots."""
    from test_packing import CONFIG as PACKED
    from test_packing import WIDTH, masking, sentence_pairs

    from lightbert.model import BertForPreTraining
    from lightbert.tasks.pretraining.packing import PackingCollator, packed_rows

    torch.manual_seed(0)
    net = BertForPreTraining(PACKED).train()
    convert_to_fp8(net)
    batch = PackingCollator(masking(), WIDTH, max_examples_per_row=4)(sentence_pairs(13, seed=3))
    with ScaledMatmuls() as calls:
        mlm, nsp = net(
            batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_positions"],
            packed=packed_rows(batch),
        )  # fmt: skip
        (mlm.float().sum() + nsp.float().sum()).backward()
    assert len(calls.calls) == 3 * (
        4 * PACKED.num_hidden_layers + 2
    )  # the layers (fused qkv), the pooler, the MLM transform
    assert calls.refused() == []
