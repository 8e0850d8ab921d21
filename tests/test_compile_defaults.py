"""speed.compile's default: a training run on a CUDA GPU compiles (null), a CPU run stays eager; the compiled path's
batches come in a few fixed lengths (length buckets, one graph each), and torch's compile caches live in lightbert's
cache directory, where a second run finds them. The GPU path is checked on CPU: the device resolved as CUDA, the
graphs counted by Dynamo through its eager backend (Inductor's C++ compile would take minutes)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from helpers.runs import compose_config, run_settings
from test_packing import CONFIG, VOCAB, WIDTH, sentence_pairs

from lightbert.data.batches import PaddingCollator, length_buckets, padded_length
from lightbert.run import speed as speed_module
from lightbert.run.settings import SpeedSettings
from lightbert.run.speed import apply_speed_switches, fix_batch_shapes, use_compile_caches
from lightbert.tasks.glue.module import SequenceClassificationModule
from lightbert.tasks.pretraining.masking import MaskingCollator
from lightbert.tasks.pretraining.module import PreTrainingModule

GPU = SimpleNamespace(on_cuda=True, precision="bf16-mixed", strategy="ddp")  # what TrainerSettings says on a GPU
MODEL = {**CONFIG.to_dict(), "num_hidden_layers": 1}  # each layer adds the same graph nodes, and seconds of tracing


@pytest.mark.parametrize(
    ("overrides", "on_cuda", "compiles"),
    [
        (["trainer=cpu"], False, False),  # the quick start and the tests' default
        (["trainer=gpu"], True, True),
        (["trainer=ddp8"], True, True),
        (["trainer=fsdp8"], True, True),
        (["trainer=gpu", "trainer.accelerator=cpu"], False, False),  # a GPU config's CPU twin is a CPU run
        (["trainer=gpu", "speed.compile=false"], True, False),  # one key turns it off
        (["trainer=gpu", "speed.unpad=groups"], True, False),  # length groups' host syncs split a compiled step
        (["trainer=cpu", "speed.compile=true"], False, True),
    ],
)
def test_training_on_a_cuda_gpu_compiles_by_default_and_a_cpu_run_stays_eager(tmp_path, overrides, on_cuda, compiles):
    with mock.patch("lightbert.distributed.runs_on_cuda", return_value=on_cuda):
        settings = run_settings(compose_config(["task=pretrain", *overrides], tmp_path))
        assert settings.compiles is compiles
    if len(overrides) == 1:
        assert settings.speed.compile is None  # the default, by the device
    assert settings.speed.compiles(on_cuda, training=False) is (settings.speed.compile is True)  # evaluation


def test_an_unknown_compile_setting_is_refused(tmp_path):
    from lightbert.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^speed.compile=auto is not known; valid: null \(by the device\), true"):
        run_settings(compose_config(["speed.compile=auto"], tmp_path))


def test_length_buckets_are_powers_of_two_up_to_the_longest_sequence():
    assert length_buckets(128) == (32, 64, 128)
    assert length_buckets(384) == (32, 64, 128, 256, 384)
    assert length_buckets(512) == (32, 64, 128, 256, 512)
    assert length_buckets(20) == (20,)
    assert [padded_length(n, (32, 64, 128)) for n in (1, 32, 33, 100, 128)] == [32, 32, 64, 128, 128]
    assert [padded_length(n, 8) for n in (1, 8, 9)] == [8, 8, 16] and padded_length(7, None) == 7


def sentences(count: int, seed: int, longest: int) -> list[dict]:
    """Single sentences of 3 to `longest` tokens, SST-2's shape."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        ids = [1, *(rng.randrange(5, VOCAB) for _ in range(rng.randint(1, longest - 2))), 2]
        rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "label": rng.randrange(2), "idx": i})
    return rows


def graphs() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.fixture
def fresh_dynamo(monkeypatch, tmp_path):
    from torch._dynamo.utils import counters

    monkeypatch.setattr(speed_module, "COMPILE_BACKEND", "eager")  # Dynamo's graphs, no AOTAutograd tracing
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def gpu_default(module, packing: bool = False, cache_dir=None) -> None:
    """apply_speed_switches as a training run on a CUDA GPU with the defaults has them."""
    with (
        mock.patch.object(speed_module, "flash_varlen_device", return_value=True),
        mock.patch("torch.cuda.current_device"),
    ):
        apply_speed_switches(
            module,
            SpeedSettings(),
            GPU,
            packing=packing,
            compiles=SpeedSettings().compiles(on_cuda=True),
            cache_dir=cache_dir,
        )


def test_the_gpu_default_fine_tuning_step_compiles_one_graph_per_length_bucket(fresh_dynamo, tmp_path):
    """A training run on a GPU with the defaults (compiled, padded) over batches of many lengths: the collator pads
    each up to a bucket (`fix_batch_shapes`), and the step compiles one graph of fixed shapes per bucket (not one
    graph whose length is a symbol), forward and backward, with no break; a batch of other rows (an epoch's last)
    makes no new graph. The losses equal the unbucketed batches' (attention masks the padding)."""
    torch.manual_seed(0)
    config = {**MODEL, "max_position_embeddings": 128}
    module = SequenceClassificationModule(config, {"lr": 1e-4, "warmup_ratio": 0.01}, task="sst2")
    module.model.eval()  # no dropout: the bucketed and the unbucketed losses are the same numbers
    reference = SequenceClassificationModule(config, {"lr": 1e-4, "warmup_ratio": 0.01}, task="sst2")
    reference.load_state_dict(module.state_dict())
    reference.model.eval()
    gpu_default(module, cache_dir=tmp_path / "cache")
    assert module.model.bert.unpad == "off" and module.compiled
    data = SimpleNamespace(packing=False, max_seq_length=128, pad_to_multiple_of=8)
    fix_batch_shapes(data, SpeedSettings(), compiles=True)
    bucketed = PaddingCollator(0, {"label": ("labels", torch.long)}, data.pad_to_multiple_of)
    plain = PaddingCollator(0, {"label": ("labels", torch.long)}, 8)
    widths, lengths = [], set()
    for seed, longest in enumerate((120, 30, 60, 100, 20, 50, 110)):
        rows = sentences(8 if seed < 6 else 5, seed, longest)  # the last: fewer rows
        batch, unbucketed = bucketed(rows), plain(rows)
        widths.append(batch["input_ids"].shape[1])
        lengths.add(unbucketed["input_ids"].shape[1])
        loss = module.loss(module(batch), batch)
        loss.backward()
        with torch.no_grad():
            torch.testing.assert_close(loss, reference.loss(reference(unbucketed), unbucketed), rtol=1e-5, atol=1e-6)
    assert widths == [128, 32, 64, 128, 32, 64, 128] and len(lengths) == 6  # unbucketed: 6 lengths, 6 graphs
    assert graphs() == (3, 0)


def test_the_gpu_default_pretraining_step_compiles_one_graph_per_length_bucket(fresh_dynamo):
    """The pre-training step of a GPU run with the defaults (compiled, padded, fixed MLM slots): batches padded up to
    a bucket make one graph for the model and one for the losses per length, forward and backward, no break,
    whatever the number of masked tokens or of rows."""
    module = PreTrainingModule(MODEL, {"lr": 1e-4, "warmup_ratio": 0.01})
    gpu_default(module)
    assert module.model.bert.unpad == "off" and module.compiled
    collate = MaskingCollator(VOCAB, 0, 3, [0, 1, 2, 3, 4], pad_to_multiple_of=length_buckets(WIDTH))
    short = [e for e in sentence_pairs(60, seed=9) if len(e["input_ids"]) <= 32]
    widths, predicted = set(), set()
    for seed in range(2):
        for examples in (sentence_pairs(8, seed=seed), short[3 * seed : 3 * seed + 3 + seed]):
            batch = collate(examples)
            widths.add(batch["input_ids"].shape[1])
            predicted.add(int((batch["labels"] != -100).sum()))
            module._step(batch)["loss"].backward()
    assert widths == {32, 64} and len(predicted) > 2
    assert graphs() == (len(widths) + 1, 0)  # the model's graph per length; the losses' (N predictions, V)


def test_compile_caches_live_in_the_cache_directory_and_a_second_run_finds_them(monkeypatch, tmp_path):
    """Inductor's FX graph cache goes under <paths.cache_dir>/torch-compile: a run compiling the same model again
    there (Dynamo reset, as a new process starts) loads its graph from the cache; in another cache directory it
    compiles it. A tiny model whose one graph is a matrix multiplication (no C++ kernel to build)."""
    from torch._dynamo.utils import counters

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)

    def compile_in(cache_dir) -> dict:
        torch._dynamo.reset()
        counters.clear()
        where = use_compile_caches(cache_dir)
        with torch.no_grad():
            torch.compile(model)(x)
        return {"where": where, **counters["inductor"]}

    try:
        first = compile_in(tmp_path / "lightbert")
        assert first["where"] == tmp_path / "lightbert" / "torch-compile"
        assert first["fxgraph_cache_miss"] == 1 and any((first["where"] / "fxgraph").iterdir())
        second = compile_in(tmp_path / "lightbert")
        assert second.get("fxgraph_cache_hit") == 1 and not second.get("fxgraph_cache_miss")
        elsewhere = compile_in(tmp_path / "other")
        assert elsewhere.get("fxgraph_cache_miss") == 1 and not elsewhere.get("fxgraph_cache_hit")
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own choice stays
        assert use_compile_caches(tmp_path / "lightbert") == tmp_path / "mine"
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
def test_a_gpu_trainer_config_fine_tunes_compiled_on_cpu(fresh_dynamo, tmp_path, caplog):
    """trainer=gpu's CPU twin (bf16-mixed, fused AdamW, clipping: the pitfalls' class) with the GPU's defaults,
    compiled and padded: it fine-tunes with length buckets and validates; the console says what compiles and how long
    the first step took, once each. (Pre-training compiled through the Trainer: tests/test_train.py.)"""
    from helpers.glue_files import glue_data_files
    from helpers.models import write_hf_bert
    from helpers.runs import cpu_twin

    from lightbert import train

    files = glue_data_files(tmp_path / "glue", "mrpc", "csv", num_rows=16)
    overrides = ["task=glue/mrpc", f"init_from={write_hf_bert(tmp_path / 'bert', num_hidden_layers=1)}", "logger=csv"]
    overrides += ["task.batch_size=4", "trainer.max_steps=-1", "trainer.max_epochs=1", "task.max_seq_length=64"]
    overrides += ["task.datamodule.num_workers=0", *(f"task.data_files.{k}={v}" for k, v in files.items())]
    overrides += [*cpu_twin("gpu"), "speed.compile=true", "speed.unpad=false"]
    with caplog.at_level("INFO", logger="lightbert"):
        tuned = train(compose_config(overrides, tmp_path / "tuned"))
    assert tuned["global_step"] == 4 and tuned["best_score"] is not None
    console = [r.getMessage() for r in caplog.records if r.name.startswith("lightbert.")]  # (train.log has more)
    said = [line for line in console if line.startswith("torch.compile")]
    assert said[0] == "torch.compile: each batch padded up to 32, 64 tokens, one compiled graph per length", said
    assert said[1].startswith("torch.compile: the model (BertForSequenceClassification), at the first step")
    assert "(speed.compile=true: as set); its caches in " in said[1]
    assert said[2].startswith("torch.compile: the first training step, compiling included, took ")
    assert len(said) == 3, said
