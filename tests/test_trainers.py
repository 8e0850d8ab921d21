"""Every GPU trainer config's whole stack on CPU: its CPU twin keeps the precision plugin (bf16-mixed), strategy,
callbacks and default optimizer (fused AdamW, or LAMB), and changes only the accelerator and the device count.

A GPU config that no test runs is broken until one does: bf16-mixed + fused AdamW + gradient clipping crashed at
the first optimizer step of every GPU trainer, and a CPU run with the same settings shows it at once.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from helpers.glue_files import glue_data_files
from helpers.ner_files import ner_data_files, ner_sentences, write_conll_text
from helpers.runs import (
    DEVICES,
    compose_config,
    console_noise,
    cpu_twin,
    pretrain_overrides,
    run_train_forked,
    write_bert_corpus,
)
from helpers.squad_files import squad_data_files
from helpers.swag_files import swag_data_files
from omegaconf import OmegaConf

from lightbert import train

pytestmark = pytest.mark.slow


def finetune_overrides(family: str, data: Path, init_from: Path) -> list[str]:
    """One task of each fine-tuning family, on small files in the hub's schema; one epoch of a few steps."""
    common = [f"init_from={init_from}", "logger=csv", "trainer.max_steps=-1", "trainer.max_epochs=1"]
    if family == "glue":
        files = glue_data_files(data / "glue", "mrpc", "csv", num_rows=16)
        task = ["task=glue/mrpc", "task.batch_size=4", "task.max_seq_length=32"]
    elif family == "squad":
        files = squad_data_files(data / "squad", "2.0", num_paragraphs=2)
        task = ["task=squad_v2", "task.batch_size=8", "task.max_seq_length=64", "task.doc_stride=16"]
        task.append("task.max_query_length=16")
    elif family == "swag":
        files = swag_data_files(data / "swag", "csv", sizes=(8, 4))
        task = ["task=swag", "task.batch_size=2"]
    else:
        files = ner_data_files(data / "ner", "conll", sizes=(8, 4, 4))
        task = ["task=conll2003", "task.batch_size=2"]
        if family == "features":
            task = ["task=conll2003_features", "task.batch_size=2", "task.lstm_hidden_size=16", "task.features=last"]
    no_workers = ["task.datamodule.num_workers=0"]
    return [*task, *common, *no_workers, *(f"task.data_files.{split}={path}" for split, path in files.items())]


FAMILIES = ["glue", "squad", "ner", "swag", "features"]


def run_twin(trainer: str, overrides: list[str], run_dir: Path) -> dict:
    """One process (trainer=gpu's twin) runs in the test's process; DDP needs the entry point, which Lightning's
    launcher starts again for the second device."""
    if DEVICES[trainer] == 1:
        return train(compose_config([*cpu_twin(trainer), *overrides], run_dir))
    result = run_train_forked(*cpu_twin(trainer), *overrides, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=30)


# (trainer, optimizer, phases): every pre-training variant on trainer=gpu's twin (one process, cheap), and one on
# each multi-process strategy. Not ddp8: on CPU its twin is ddp's Trainer (test_ddp8_twin_is_ddp_twin), and its own
# command runs as docs/scale.md's block (tests/test_readme.py, which checks its console too).
PRETRAINING = [
    ("gpu", "adamw", 1),
    ("gpu", "adamw", 2),
    ("gpu", "lamb", 1),
    ("gpu", "lamb", 2),
    ("ddp", "lamb", 2),
    ("fsdp", "lamb", 2),
]


@pytest.fixture(scope="module")
def pretrained(corpus, tmp_path_factory) -> dict[tuple[str, str, int], Path]:
    """The run directory of each pre-training variant, trained once for the module."""
    runs = {}
    for trainer, optimizer, phases in PRETRAINING:
        run_dir = tmp_path_factory.mktemp(f"pretrain-{trainer}-{optimizer}-{phases}") / "run"
        results = run_twin(trainer, pretrain_overrides(corpus, optimizer, phases), run_dir)
        runs[trainer, optimizer, phases] = (run_dir, results)
    return runs


@pytest.mark.parametrize(("trainer", "optimizer", "phases"), PRETRAINING)
def test_pretraining_runs_on_every_trainer_config(pretrained, trainer, optimizer, phases):
    run_dir, results = pretrained[trainer, optimizer, phases]
    assert results["global_step"] == 4
    assert (run_dir / "results.json").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    config = OmegaConf.load(run_dir / ".hydra" / "config.yaml") if (run_dir / ".hydra").is_dir() else None
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    # What ran is the GPU config's stack: bf16 autocast, and the config's optimizer (fused AdamW by default).
    assert checkpoint["hyper_parameters"]["optim"]["name"] == optimizer
    optimizer_state = checkpoint["optimizer_states"][0]
    assert optimizer_state["param_groups"][0]["fused" if optimizer == "adamw" else "adapt"] is True
    assert len(checkpoint["optimizer_states"]) == 1
    if config is not None:  # the entry point's record of the run
        assert config.trainer.precision == "bf16-mixed" and config.trainer.gradient_clip_val == 1.0
    metrics = results["metrics"]
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    assert "val/loss" in metrics


# Fine-tuning: each family from the pre-training run of the same trainer. Not ddp8: on CPU its twin composes to the
# same Trainer as ddp's (asserted below), and its checkpoint's kind (AdamW, one phase) is trainer=gpu's, which the gpu
# rows fine-tune from: its five runs were ddp's five again. Not GLUE and SQuAD on ddp: their two-process runs are
# tests/test_glue.py's and tests/test_squad.py's (every example counted once), and bf16 is the gpu rows'. On fsdp, a
# token's head (SQuAD's spans) and none trained on a frozen encoder (features): NER's token head and SWAG's sequence
# head are those again, and a GLUE fine-tune under FSDP from an FSDP run is tests/test_fsdp.py's (which evaluates and
# converts it too).
SKIPPED = {"ddp": ("glue", "squad"), "fsdp": ("glue", "ner", "swag")}
FINETUNING = [
    (trainer, family)
    for trainer in DEVICES
    if trainer != "ddp8"
    for family in FAMILIES
    if family not in SKIPPED.get(trainer, ())
]
BASE_OF = {
    "gpu": ("gpu", "adamw", 1),
    "ddp": ("ddp", "lamb", 2),
    "fsdp": ("fsdp", "lamb", 2),
}


@pytest.mark.parametrize(("trainer", "family"), FINETUNING)
def test_fine_tuning_runs_on_every_trainer_config(pretrained, trainer, family, tmp_path):
    base_dir, _ = pretrained[BASE_OF[trainer]]
    results = run_twin(trainer, finetune_overrides(family, tmp_path / "data", base_dir), tmp_path / "run")
    assert results["global_step"] > 0
    assert results["monitor"] and results["best_score"] is not None
    assert (tmp_path / "run" / "results.json").is_file()
    if family in ("glue", "squad", "ner", "features"):  # the families that write prediction files
        assert results["predictions"], results


def test_ddp8_twin_is_ddp_twin(tmp_path):
    """On CPU, ddp8 with devices=2 is the same Trainer as ddp with devices=2: same precision, strategy, clipping."""
    configs = [compose_config(cpu_twin(name), tmp_path / "run").trainer for name in ("ddp", "ddp8")]
    assert OmegaConf.to_container(configs[0], resolve=True) == OmegaConf.to_container(configs[1], resolve=True)


@pytest.mark.parametrize("trainer", ["gpu", "ddp", "ddp8", "fsdp", "fsdp8"])
def test_every_trainer_config_keeps_bf16_and_clipping(tmp_path, trainer):
    cfg = compose_config([f"trainer={trainer}"], tmp_path / "run")
    assert cfg.trainer.precision == "bf16-mixed"
    assert cfg.trainer.gradient_clip_val == 1.0
    assert cfg.optim.fused is None  # the fused kernel, the fastest correct AdamW


def dry_run(trainer: str, corpus: Path, run_dir: Path) -> list[str]:
    return [
        f"trainer={trainer}",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_steps=3",
        "model=bert_tiny",
        "corpus=text",
        f"corpus.paths=[{corpus}]",
        "task.datamodule.vocab_size=400",
        "task.datamodule.num_workers=0",
        "logger=csv",
        f"hydra.run.dir={run_dir}",
    ]


def test_readme_dry_run_works_for_fsdp(corpus, tmp_path):
    """FSDP2 runs on CPU processes over gloo: docs/scale.md's dry run with trainer=fsdp8 trains, sharded over 2
    processes. (The page's block itself, with trainer=ddp8, runs in tests/test_readme.py.)"""
    result = run_train_forked(*dry_run("fsdp8", corpus, tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["global_step"] == 3
    summary = [line for line in result.stdout.splitlines() if line.startswith("lightbert: pretrain: L2/H128/A2")]
    assert len(summary) == 1 and "2 x cpu, strategy fsdp (FSDP2, fully_shard), bf16-mixed, 3 steps" in summary[0]
    assert console_noise(result) == []


def test_the_console_says_what_a_user_must_know(corpus, tmp_path):
    """Phases, "nothing to resume", the checkpoint init_from loaded, heads started fresh and data that was cut reach
    the console (stdout), each once, after the run directory and before training."""
    pretrain = run_train_forked(
        *pretrain_overrides(corpus, "adamw", phases=2), "resume=true", f"hydra.run.dir={tmp_path / 'pre'}"
    )
    assert pretrain.returncode == 0, pretrain.stderr[-3000:]
    lines = pretrain.stdout.splitlines()
    assert lines[0] == f"lightbert: run directory: {tmp_path / 'pre'}"
    assert lines[1].startswith(f"lightbert: resume=true and no {tmp_path / 'pre' / 'checkpoints' / 'last.ckpt'} yet")
    assert sum(line.startswith("lightbert: phase 1/2: steps 0-2") for line in lines) == 1
    assert sum(line.startswith("lightbert: phase 2/2: steps 2-4") for line in lines) == 1

    sentences = ner_sentences(8, seed=1)
    sentences.append((["river"] * 300, ["O"] * 300))  # 300 words: cut at task.max_seq_length
    files = {"train": write_conll_text(tmp_path / "train.txt", sentences)}
    files["validation"] = write_conll_text(tmp_path / "dev.txt", ner_sentences(4, seed=2))
    finetune = run_train_forked(
        "task=conll2003",
        f"init_from={tmp_path / 'pre'}",
        "logger=csv",
        "trainer.max_steps=2",
        "task.datamodule.num_workers=0",
        *(f"task.data_files.{split}={path}" for split, path in files.items()),
        f"hydra.run.dir={tmp_path / 'ner'}",
    )
    assert finetune.returncode == 0, finetune.stderr[-3000:]
    out = finetune.stdout
    best = json.loads((tmp_path / "pre" / "results.json").read_text())["best_checkpoint"]
    assert out.count(f"lightbert: init_from={tmp_path / 'pre'}: its best checkpoint, {best}") == 1, out
    assert out.count("lightbert: the token classification head starts fresh") == 1, out
    assert out.count("1 sentence(s) longer than task.max_seq_length=128 sub-tokens were cut") == 1, out
    assert out.index("lightbert: run directory") < out.index("were cut") < out.index("lightbert: finished")
    # An epoch of one step, shorter than trainer.log_every_n_steps: its loss is logged, and Lightning's warning is not
    assert console_noise(finetune) == [] and "logging interval" not in finetune.stderr + out
    rows = list(csv.DictReader((tmp_path / "ner" / "metrics.csv").read_text().splitlines()))
    assert any(row.get("train/loss") for row in rows)
