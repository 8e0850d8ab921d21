"""The throughput callback (tokens/s of real tokens, MFU as useful FLOPs over the peak) and the progress bar."""

import io
import logging
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers.models import TINY

from lightbert.model import BertForPreTraining, BertForSequenceClassification
from lightbert.plugins.callbacks import RunProgressBar, Throughput, gpu_peak_flops, step_flops


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


class TinyRegression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 2)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_progress_bar_counts_the_whole_run_after_a_resume(tmp_path, monkeypatch):
    """A run that steps decide shows steps of the run: resumed at step 2 of 6, the bar ends at 6/6 (Lightning's
    own read `6/3`: the run's batch count over the epoch's batches left); no `v_num` beside the loss."""
    monkeypatch.setattr("lightbert.plugins.callbacks.console_is_a_terminal", lambda: True)
    bars = []

    def fit(max_steps: int, ckpt_path=None):
        bars.append(RunProgressBar())
        every_two = L.pytorch.callbacks.ModelCheckpoint(tmp_path, "last", every_n_train_steps=2, save_top_k=-1)
        trainer = L.Trainer(
            max_steps=max_steps, max_epochs=-1, callbacks=[bars[-1], every_two], logger=False, accelerator="cpu",
            default_root_dir=tmp_path, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(TinyRegression(), ckpt_path=ckpt_path)
        return trainer

    fit(2)
    trainer = fit(6, ckpt_path=tmp_path / "last.ckpt")
    bar = bars[-1].train_progress_bar
    assert (bar.n, bar.total, bar.initial) == (6, 6, 2)
    assert trainer.global_step == 6
    metrics = bars[-1].get_metrics(trainer, trainer.lightning_module)
    assert "train/loss" in metrics and "v_num" not in metrics


def test_the_progress_bar_is_off_where_no_one_watches(monkeypatch):
    monkeypatch.setattr("lightbert.plugins.callbacks.console_is_a_terminal", lambda: False)
    assert RunProgressBar().is_disabled  # SLURM's file, nohup: ConsoleReport's plain lines instead


def test_console_lines_go_above_the_progress_bar_not_into_it():
    from tqdm import tqdm

    from lightbert.run.console import AboveProgressBars

    stream = io.StringIO()
    bar = tqdm(total=4, file=stream, ncols=60, mininterval=0)
    bar.update(2)
    logger = logging.getLogger("lightbert.tests.above_progress_bars")
    logger.addHandler(AboveProgressBars(stream))
    logger.propagate = False
    logger.warning("validation at step 2")
    bar.close()
    written = stream.getvalue()
    line = written.index("validation at step 2")
    assert "2/4" in written[:line] and written[:line].endswith("\r")  # the bar was drawn, then taken down
    assert "2/4" in written[line:]  # and drawn again below the line


def test_packed_rows_count_their_examples_and_each_example_s_attention():
    """Packed rows hold several examples: examples/s counts them, and MFU's attention term is each example's."""
    from lightbert.plugins.callbacks import sequence_lengths

    plain = {"attention_mask": torch.tensor([[1] * 6 + [0] * 2, [1] * 8])}
    assert sequence_lengths(plain).tolist() == [6, 8]
    documents = torch.tensor([[1, 1, 1, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    packed = {"attention_mask": (documents > 0).long(), "document_ids": documents, "cls_positions": torch.zeros(2, 3)}
    assert sequence_lengths(packed).tolist() == [3, 2, 0, 8, 0, 0]
