"""The global batch: said on the run line with the devices resolved, and kept by task.global_batch_size whatever the
devices and nodes (the accumulation derived); what cannot be made exactly is refused naming the keys."""

from __future__ import annotations

import pytest
from helpers.runs import compose_config, run_settings

from lightbert.errors import ConfigError
from lightbert.model_config import BertConfig
from lightbert.run.run_line import describe_run


def batches(tmp_path, *overrides: str) -> tuple[int, int, int]:
    made = run_settings(compose_config(["trainer=cpu", *overrides], tmp_path / "run")).batches
    return made.devices, made.accumulate, made.global_batch


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], (1, 1, 32)),
        (["trainer.devices=2", "trainer.num_nodes=4"], (2, 1, 256)),
        (["trainer.devices=2", "trainer.accumulate_grad_batches=4"], (2, 4, 256)),
        (["task.global_batch_size=256"], (1, 8, 256)),
        (["task.global_batch_size=256", "trainer.devices=2", "trainer.num_nodes=2"], (2, 2, 256)),
        (["task.global_batch_size=256", "trainer.devices=2", "trainer.accumulate_grad_batches=4"], (2, 4, 256)),
        (["trainer.devices=-1"], (1, 1, 32)),  # on CPU processes, as Lightning resolves it
    ],
)
def test_the_global_batch_is_batch_x_devices_x_nodes_x_accumulation(tmp_path, overrides, expected):
    assert batches(tmp_path, *overrides) == expected


def test_a_global_batch_the_devices_cannot_make_is_refused_naming_the_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"task.global_batch_size=100 is not a multiple of task.batch_size \(32\)"):
        batches(tmp_path, "task.global_batch_size=100")
    with pytest.raises(ConfigError, match="and trainer.accumulate_grad_batches=3 asks for another; set one of the two"):
        batches(tmp_path, "task.global_batch_size=256", "trainer.accumulate_grad_batches=3")


def test_the_run_line_states_devices_nodes_accumulation_and_the_global_batch(tmp_path):
    cfg = compose_config(["trainer=cpu", "trainer.devices=-1", "trainer.num_nodes=2", "task.global_batch_size=256"],
                         tmp_path / "run")  # fmt: skip
    line = describe_run(run_settings(cfg), BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4))
    assert "; 1 x cpu x 2 nodes," in line and "-1" not in line
    assert line.endswith("batch 32 per device x 4 accumulated = 256 per step")


def test_what_cannot_accumulate_is_refused_where_the_global_batch_derives_accumulation(tmp_path):
    cfg = compose_config(["trainer=cpu", "task.global_batch_size=256", "trainer.precision=bf16-true"], tmp_path / "r")
    with pytest.raises(ConfigError, match=r"needs 8 accumulated batches .*=bf16-true \(bf16 gradients\) cannot"):
        run_settings(cfg).batches  # noqa: B018
    cfg = compose_config(["trainer=cpu", "task.global_batch_size=32", "trainer.precision=bf16-true"], tmp_path / "r")
    assert run_settings(cfg).batches.accumulate == 1
