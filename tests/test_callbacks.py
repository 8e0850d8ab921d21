"""The throughput callback: tokens/s of real tokens, and MFU as useful FLOPs over the peak."""

from types import SimpleNamespace

import pytest
import torch
from helpers.models import TINY

from lightbert.model import BertForPreTraining, BertForSequenceClassification
from lightbert.run.callbacks import Throughput, gpu_peak_flops, step_flops


class RecordingModule(torch.nn.Module):
    """What the callback reads of a LightningModule: config, model, device and log()."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.config, self.model, self.device, self.logged = TINY, model, torch.device("cpu"), {}

    def log(self, name, value, **kwargs):
        self.logged[name] = float(value)


def logged_after_one_step(model: torch.nn.Module, batch: dict, peak: float | None = 1e12) -> dict:
    callback, module = Throughput(peak_flops=peak), RecordingModule(model)
    callback.on_fit_start(None, module)
    callback.on_train_batch_start(None, module, batch, 0)
    trainer = SimpleNamespace(_logger_connector=SimpleNamespace(should_update_logs=True))  # a step that is logged
    callback.on_train_batch_end(trainer, module, None, batch, 0)
    return module.logged


def test_mfu_is_useful_flops_of_the_batch_over_the_peak():
    mask = torch.tensor([[1] * 10 + [0] * 6, [1] * 16])
    labels = torch.full((2, 16), -100)
    labels[0, [2, 5]] = 7
    labels[1, 3] = 9
    logged = logged_after_one_step(BertForPreTraining(TINY), {"attention_mask": mask, "labels": labels})
    # Both rates share the step's seconds, so their ratio is the FLOPs per real token, whatever the clock said.
    flops_per_token = logged["train/mfu"] * 1e12 / logged["train/tokens_per_s"]
    expected = float(step_flops(TINY, torch.tensor([10, 16]), 3)) / 26
    assert flops_per_token == pytest.approx(expected, rel=1e-5)
    # Fine-tuning heads count no MLM work, even with (B, T)-shaped labels.
    logged = logged_after_one_step(BertForSequenceClassification(TINY, 2), {"attention_mask": mask, "labels": labels})
    expected = float(step_flops(TINY, torch.tensor([10, 16]))) / 26
    assert logged["train/mfu"] * 1e12 / logged["train/tokens_per_s"] == pytest.approx(expected, rel=1e-5)


def test_no_mfu_without_a_known_peak_or_with_a_frozen_encoder():
    batch = {"attention_mask": torch.ones(2, 8, dtype=torch.long), "labels": torch.zeros(2, dtype=torch.long)}
    assert set(logged_after_one_step(BertForSequenceClassification(TINY, 2), batch, peak=None)) == {
        "train/tokens_per_s",
        "train/examples_per_s",
    }  # on CPU there is no datasheet peak
    frozen = BertForSequenceClassification(TINY, 2)
    frozen.bert.requires_grad_(False)
    assert "train/mfu" not in logged_after_one_step(frozen, batch)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla V100-SXM2-16GB", None),  # no bf16 tensor cores: no MFU rather than a wrong one
    ],
)
def test_gpu_peak_of_the_gpus_people_use(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert gpu_peak_flops(torch.device("cuda", 0)) == peak
    assert gpu_peak_flops(torch.device("cpu")) is None
