"""speed.compile_mode=reduce-overhead (CUDA graphs), checked on CPU against what torch's CUDA graph trees need: no
gradient accumulation (a replay overwrites the gradients being accumulated, a hard error in torch), and one graph
recorded per input shape, so batches of a few shapes only."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from helpers.runs import compose_config, run_settings
from test_packing import CONFIG, WIDTH, masking, model, sentence_pairs

from lightbert.errors import ConfigError
from lightbert.run.settings import SpeedSettings
from lightbert.run.speed import fix_batch_shapes
from lightbert.tasks.pretraining.module import PreTrainingModule
from lightbert.tasks.pretraining.packing import PackingCollator, first_fit, fixed_row_counts

CUDA_GRAPHS = ["speed.compile=true", "speed.compile_mode=reduce-overhead"]
PACKED = ["task=pretrain", "task.datamodule.packing=true"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [*PACKED, *CUDA_GRAPHS, "trainer.accumulate_grad_batches=4"],
            "speed.compile_mode=reduce-overhead (CUDA graphs) cannot run with trainer.accumulate_grad_batches=4",
        ),
        (
            ["task=glue/sst2", "init_from=x", *CUDA_GRAPHS, "speed.unpad=groups"],
            "speed.unpad=groups changes the token count every batch",
        ),
        (["task=pretrain", *CUDA_GRAPHS], "set task.datamodule.packing=true"),
    ],
)
def test_cuda_graphs_are_refused_where_they_cannot_run(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as refused:
        run_settings(compose_config(overrides, tmp_path))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_cuda_graphs_with_packing_and_no_accumulation_are_accepted(tmp_path):
    run_settings(compose_config([*PACKED, *CUDA_GRAPHS], tmp_path / "a"))
    run_settings(compose_config(["task=glue/sst2", "init_from=x", *CUDA_GRAPHS], tmp_path / "b"))
    # Accumulation stays with every other compile mode, and without compiling.
    run_settings(compose_config([*PACKED, "speed.compile=true", "trainer.accumulate_grad_batches=4"], tmp_path / "c"))
    only_the_mode = [*PACKED, "speed.compile_mode=reduce-overhead", "trainer.accumulate_grad_batches=4"]
    run_settings(compose_config(only_the_mode, tmp_path / "d"))


def pretraining_lengths(rng: random.Random, count: int, width: int = 128) -> list[int]:
    """Example lengths as create_instances gives them: 10% short targets (short_seq_prob), the rest filling the
    row up to where the sentences end."""
    return [rng.randint(8, width) if rng.random() < 0.1 else rng.randint(width - 28, width) for _ in range(count)]


def finetuning_lengths(rng: random.Random, count: int, width: int = 128) -> list[int]:
    return [rng.randint(8, 60) for _ in range(count)]


@pytest.mark.parametrize("lengths", [pretraining_lengths, finetuning_lengths])
def test_packed_batches_meet_at_most_four_row_counts_with_under_ten_percent_empty_rows(lengths):
    """Packing B examples gives R <= B rows, R changing from batch to batch; CUDA graph trees record one graph per
    R. Padded up to `fixed_row_counts`, 100 batches of 256 meet at most 4 row counts, under 10% of rows empty."""
    rng, batch, per_row = random.Random(0), 256, 8
    counts = fixed_row_counts(batch, per_row)
    needed = [len(first_fit(lengths(rng, batch), 128, per_row)) for _ in range(100)]
    padded = [next(c for c in counts if c >= rows) for rows in needed]
    assert len(set(needed)) > 4  # what the graphs would record unpadded
    assert len(set(padded)) <= 4, sorted(set(padded))
    assert max((p - n) / p for p, n in zip(padded, needed, strict=True)) < 0.1
    assert list(counts) == sorted(set(counts)) and counts[-1] == batch and counts[0] == batch // per_row


def test_empty_rows_change_no_loss_and_the_collator_pads_up_to_a_fixed_count():
    examples = sentence_pairs(16, seed=1)
    module = PreTrainingModule(CONFIG.to_dict(), {"lr": 1e-4, "warmup_ratio": 0.01})
    module.model.load_state_dict(model().state_dict())
    module.eval()
    plain = PackingCollator(masking(), WIDTH)(examples)
    rows = plain["input_ids"].shape[0]
    fixed = PackingCollator(masking(), WIDTH, row_counts=(rows - 1, rows + 3, 2 * rows))(examples)
    assert fixed["input_ids"].shape[0] == rows + 3  # the first count that holds the rows
    assert fixed["masked_positions"].shape[0] == rows + 3  # the MLM logits' shape is fixed too
    assert {key: value.shape[1:] for key, value in fixed.items()} == {k: v.shape[1:] for k, v in plain.items()}
    empty = slice(rows, None)
    assert not fixed["attention_mask"][empty].any() and (fixed["example_index"][empty] == -1).all()
    with torch.no_grad():
        want, got = module._step(plain), module._step(fixed)
    for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "num_predictions"):
        assert abs(float(want[name]) - float(got[name])) < 1e-6, name


def test_compiled_runs_fix_the_batch_shapes():
    """reduce-overhead: packed rows padded up to fixed counts; other batches padded to max_seq_length (no sequence
    is longer). The default mode: unpacked batches padded up to a length bucket, packed rows as they are (one width).
    A run that does not compile: untouched."""

    def datamodule(packing: bool) -> SimpleNamespace:
        return SimpleNamespace(packing=packing, fixed_rows=False, max_seq_length=128, pad_to_multiple_of=8)

    packed, plain = datamodule(True), datamodule(False)
    graphs = SpeedSettings(compile=True, compile_mode="reduce-overhead")
    assert "packed row counts padded up to a few fixed ones" in fix_batch_shapes(packed, graphs, compiles=True)
    assert "every batch padded to 128 tokens" in fix_batch_shapes(plain, graphs, compiles=True)
    assert packed.fixed_rows and plain.pad_to_multiple_of == 128

    packed, plain = datamodule(True), datamodule(False)
    said = fix_batch_shapes(plain, SpeedSettings(), compiles=True)
    assert said == "torch.compile: each batch padded up to 32, 64, 128 tokens, one compiled graph per length"
    assert plain.pad_to_multiple_of == (32, 64, 128)
    assert fix_batch_shapes(packed, SpeedSettings(), compiles=True) is None and packed.pad_to_multiple_of == 8
    assert not packed.fixed_rows

    untouched = datamodule(False)
    assert fix_batch_shapes(untouched, graphs, compiles=False) is None and untouched.pad_to_multiple_of == 8
