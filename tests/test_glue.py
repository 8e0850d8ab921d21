"""GLUE: metrics equal to scikit-learn/scipy, encoding, every task end to end on local files, and bad input."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.glue_files import glue_data_files, glue_overrides, write_glue_file
from helpers.models import write_hf_bert
from helpers.runs import compose_config, run_train_forked, run_train_script
from helpers.wandb_files import offline_run
from omegaconf import OmegaConf
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from lightbert import train
from lightbert.checkpoints.reading import load_pretrained
from lightbert.data.batches import UnpaddedDistributedSampler
from lightbert.data.encoding import truncate_pair
from lightbert.data.tokenizer import load_tokenizer
from lightbert.errors import ConfigError, UserError
from lightbert.model_config import BertConfig
from lightbert.run.model_choice import size_name
from lightbert.tasks.glue.data import GlueDataModule, encode_examples
from lightbert.tasks.glue.metrics import glue_metrics
from lightbert.tasks.glue.module import SequenceClassificationModule
from lightbert.tasks.glue.tasks import TASKS

REFERENCE = {
    "accuracy": accuracy_score,
    "f1": f1_score,
    "mcc": matthews_corrcoef,
    "pearson": lambda y, p: pearsonr(y, p)[0],
    "spearman": lambda y, p: spearmanr(y, p)[0],
}


def fake_predictions(task: str, n: int = 301, seed: int = 0):
    rng = np.random.default_rng(seed)
    spec = TASKS[task]
    if spec.is_regression:
        labels = rng.uniform(0, 5, n)
        return labels, labels + rng.normal(0, 1.5, n)  # correlated, not equal
    labels = rng.integers(0, spec.num_labels, n)
    predictions = np.where(rng.random(n) < 0.6, labels, rng.integers(0, spec.num_labels, n))
    return labels, predictions


@pytest.mark.parametrize("task", sorted(TASKS))
def test_metrics_equal_scikit_learn_and_scipy(task):
    labels, predictions = fake_predictions(task)
    metrics = glue_metrics(TASKS[task])
    dtype = torch.float if TASKS[task].is_regression else torch.long
    for chunk in np.array_split(np.arange(len(labels)), 7):  # batch by batch, as in validation
        metrics.update(torch.tensor(predictions[chunk], dtype=dtype), torch.tensor(labels[chunk], dtype=dtype))
    values = metrics.compute()
    assert set(values) == set(TASKS[task].metrics)
    for name, value in values.items():
        assert float(value) == pytest.approx(REFERENCE[name](labels, predictions), abs=1e-5), name


def test_metrics_over_shards_of_several_devices_count_every_example_once():
    labels, predictions = fake_predictions("mrpc", n=103)
    world = 4
    shards = []
    for rank in range(world):
        indices = list(UnpaddedDistributedSampler(range(len(labels)), num_replicas=world, rank=rank))
        shard = glue_metrics(TASKS["mrpc"])
        shard.update(torch.tensor(predictions[indices]), torch.tensor(labels[indices]))
        shards.append((indices, shard))
    seen = sorted(i for indices, _ in shards for i in indices)
    assert seen == list(range(len(labels)))  # no example dropped, none repeated
    # What torchmetrics' sync does across processes: merge the states, then compute.
    merged = shards[0][1]
    for _, shard in shards[1:]:
        for name in merged:
            merged[name].merge_state(shard[name])
    values = merged.compute()
    assert float(values["f1"]) == pytest.approx(f1_score(labels, predictions), abs=1e-6)
    assert float(values["accuracy"]) == pytest.approx(accuracy_score(labels, predictions), abs=1e-6)


def test_truncation_drops_from_the_longer_sequence_first():
    a, b = truncate_pair(list(range(10)), list(range(100, 104)), 9)
    assert (a, b) == ([0, 1, 2, 3, 4], [100, 101, 102, 103])
    a, b = truncate_pair(list(range(6)), list(range(100, 106)), 7)
    assert len(a) + len(b) == 7 and abs(len(a) - len(b)) <= 1


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("hf") / "bert")


def test_pairs_are_encoded_as_cls_a_sep_b_sep_with_segments(hf_dir):
    tokenizer = load_tokenizer(hf_dir / "vocab.txt")
    batch = {"sentence1": ["the film was good " * 20], "sentence2": ["the river"]}
    out = encode_examples(batch, tokenizer, ("sentence1", "sentence2"), max_seq_length=16)
    ids, types = out["input_ids"][0], out["token_type_ids"][0]
    assert len(ids) == 16 and ids[0] == tokenizer.cls_id
    assert [i for i, t in enumerate(ids) if t == tokenizer.sep_id] == [12, 15]
    assert types == [0] * 13 + [1] * 3
    assert tokenizer.convert_ids_to_tokens(ids[13:15]) == ["the", "river"]


FORMATS = ["csv", "tsv", "json", "jsonl", "parquet"]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_glue_task_fine_tunes_end_to_end_on_local_files(task, hf_dir, tmp_path):
    ext = FORMATS[sorted(TASKS).index(task) % len(FORMATS)]
    files = glue_data_files(tmp_path / "data", task, ext)
    results = train(compose_config(glue_overrides(task, files, hf_dir), tmp_path / "run"))
    spec = TASKS[task]
    metrics = results["metrics"]
    tags = ["_m", "_mm"] if task == "mnli" else [""]
    for tag in tags:  # MNLI reports both validation sets
        for name in spec.metrics:
            assert f"val/{name}{tag}" in metrics
    assert results["monitor"] == "val/score" and results["best_score"] is not None
    assert results["global_step"] == 2 * 3  # 2 epochs of 24 rows in batches of 8
    # Submission files: named as the GLUE server expects, one row per test example, labels in its format.
    assert sorted(p.rsplit("/", 1)[1] for p in results["predictions"]) == sorted(spec.submission_files)
    for path in results["predictions"]:
        rows = list(csv.reader(Path(path).read_text().splitlines(), delimiter="\t"))
        assert rows[0] == ["index", "prediction"] and [int(r[0]) for r in rows[1:]] == list(range(12))
        predictions = {r[1] for r in rows[1:]}
        if spec.is_regression:
            assert all(0 <= float(p) <= 5 for p in predictions)
        elif spec.submit_label_names:
            assert predictions <= set(spec.label_names)
        else:
            assert predictions <= {str(i) for i in range(spec.num_labels)}
    # The fine-tuned checkpoint loads back on its own.
    module = SequenceClassificationModule.load_from_checkpoint(results["best_checkpoint"], weights_only=True)
    assert module.spec.name == task


def test_test_predictions_are_skipped_without_a_test_file(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "rte")
    del files["test"]
    results = train(compose_config(glue_overrides("rte", files, hf_dir), tmp_path / "run"))
    assert results["predictions"] == [] and not (tmp_path / "run" / "predictions").exists()


# -- errors a user can make -----------------------------------------------------------------------------------


def run_glue(tmp_path, hf_dir, task: str, files: dict, extra: tuple = ()):
    return train(compose_config(glue_overrides(task, files, hf_dir) + list(extra), tmp_path / "run"))


def test_missing_split_names_the_override_to_add(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "mnli")
    del files["validation_mismatched"]
    with pytest.raises(UserError, match=r"task.data_files.validation_mismatched=PATH"):
        run_glue(tmp_path, hf_dir, "mnli", files)


def test_missing_file_is_named(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "sst2")
    files["validation"] = tmp_path / "nope.csv"
    with pytest.raises(UserError, match="nope.csv does not exist"):
        run_glue(tmp_path, hf_dir, "sst2", files)


def test_wrong_column_names_list_the_expected_ones(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "mrpc", "jsonl")
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    files["train"].write_text("".join(json.dumps({"text": r["sentence1"], "label": r["label"]}) + "\n" for r in rows))
    with pytest.raises(UserError, match=r"lacks the column\(s\) \['sentence1', 'sentence2'\]"):
        run_glue(tmp_path, hf_dir, "mrpc", files)


def test_labels_out_of_range_are_refused(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "sst2")
    files["train"].write_text(files["train"].read_text().replace(",1,", ",7,", 1))
    with pytest.raises(UserError, match="label 7 is out of range"):
        run_glue(tmp_path, hf_dir, "sst2", files)
    assert not list((tmp_path / "run").glob("results.json"))


def test_label_names_are_accepted_in_local_files(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "rte", "jsonl")
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in files[split].read_text().splitlines()]
        files[split].write_text(
            "".join(json.dumps({**r, "label": TASKS["rte"].label_names[r["label"]]}) + "\n" for r in rows)
        )
    assert run_glue(tmp_path, hf_dir, "rte", files)["global_step"] == 6


def test_stsb_scores_outside_0_to_5_are_refused(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "stsb")
    write_glue_file(files["validation"], "stsb", 12)
    text = files["validation"].read_text().splitlines()
    text[1] = text[1].rsplit(",", 2)[0] + ",9.5,0"
    files["validation"].write_text("\n".join(text) + "\n")
    with pytest.raises(UserError, match="not a similarity score"):
        run_glue(tmp_path, hf_dir, "stsb", files)


def test_fine_tuning_without_init_from_says_what_to_give(tmp_path):
    files = glue_data_files(tmp_path / "data", "cola")
    overrides = [o for o in glue_overrides("cola", files, "x") if not o.startswith("init_from")]
    with pytest.raises(UserError, match="set init_from="):
        train(compose_config(overrides, tmp_path / "run"))


def test_unknown_task_name_lists_the_glue_tasks():
    result = run_train_script("task=glue/mrcp")
    assert result.returncode == 2
    assert "Did you mean task=glue/mrpc?" in result.stderr and "glue/wnli" in result.stderr


def test_unknown_split_name_is_refused(hf_dir, tmp_path):
    files = glue_data_files(tmp_path / "data", "sst2")
    files["dev"] = files.pop("validation")
    result = run_train_script(*glue_overrides("sst2", files, hf_dir), f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "task.data_files" in result.stderr and "dev" in result.stderr


@pytest.mark.slow
def test_two_process_ddp_counts_every_validation_example_once(hf_dir, tmp_path):
    """13 validation rows on 2 processes: Lightning's sampler would repeat one; the metrics equal 1 process."""
    train_file = write_glue_file(tmp_path / "train.csv", "mrpc", 32, seed=1)
    val_file = write_glue_file(tmp_path / "val.csv", "mrpc", 13, seed=2)
    test_file = write_glue_file(tmp_path / "test.csv", "mrpc", 13, seed=3, labelled=False)
    results = {}
    for devices in (1, 2):
        run = tmp_path / f"run{devices}"
        overrides = [
            "task=glue/mrpc",
            f"init_from={hf_dir}",
            f"task.data_files.train={train_file}",
            f"task.data_files.validation={val_file}",
            f"task.data_files.test={test_file}",
            "trainer=cpu",
            "trainer.max_epochs=1",
            "optim.lr=1e-9",  # and the warmup's first step has lr 0: the weights stay as loaded
            "logger=csv",
            "task.datamodule.num_workers=0",
        ]
        if devices == 1:  # the reference, in this process; two DDP processes are a command's
            train(compose_config(overrides, run))
        else:
            result = run_train_forked(*overrides, "trainer.devices=2", "trainer.strategy=ddp", f"hydra.run.dir={run}")
            assert result.returncode == 0, result.stderr[-3000:]
        results[devices] = json.loads((run / "results.json").read_text())["metrics"]
        rows = (run / "predictions" / "MRPC.tsv").read_text().splitlines()
        assert [int(r.split("\t")[0]) for r in rows[1:]] == list(range(13))  # gathered from both processes
    for name in ("val/accuracy", "val/f1", "val/loss", "val/score"):
        assert results[2][name] == pytest.approx(results[1][name], abs=1e-6), name
    assert results[1]["val/accuracy"] * 13 == pytest.approx(round(results[1]["val/accuracy"] * 13))


def test_hub_data_without_network_says_to_give_local_files(hf_dir, tmp_path, monkeypatch):
    # What HF_HUB_OFFLINE=1 does, set after the libraries read it: fail at once instead of retrying for ~25 s.
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"could not load nyu-mll/glue/qnli.*task.data_files.train=PATH"):
        run_glue(tmp_path, hf_dir, "qnli", {})


def test_a_fine_tune_records_the_checkpoints_model_not_the_model_default(hf_dir, tmp_path):
    """init_from decides the sizes: the run's name, W&B tags and .hydra/config.yaml say the model that ran."""
    files = glue_data_files(tmp_path / "data", "sst2", "csv", num_rows=8)
    overrides = [o for o in glue_overrides("sst2", files, hf_dir) if o != "logger=csv"] + ["trainer.max_steps=1"]
    run = tmp_path / "run"
    cfg = compose_config(overrides, run)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))  # as Hydra writes it before the run
    assert cfg.model.num_hidden_layers == 4  # model=bert_mini, the default
    train(cfg)
    expected = size_name(BertConfig.from_dict(load_pretrained(str(hf_dir)).config))
    logged = offline_run(run)
    assert logged["name"] == f"sst2-{expected}" and expected in logged["tags"] and "bert_mini" not in logged["tags"]
    recorded = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert recorded.model.num_hidden_layers == load_pretrained(str(hf_dir)).config["num_hidden_layers"]


@pytest.mark.parametrize(
    ("given", "expected"), [(1.0, 1), ("0.0", 0), (True, 1), (False, 0), ("1", 1), ("positive", 1)]
)
def test_labels_written_as_floats_or_booleans_are_class_indices(given, expected):
    from lightbert.tasks.glue.data import label_to_number
    from lightbert.tasks.glue.tasks import glue_task

    assert label_to_number(given, 0, glue_task("sst2"), "train.csv") == {"label": expected}


@pytest.mark.parametrize("given", [1.5, "1.5", 2.0, -1])
def test_a_label_that_is_no_class_names_its_row(given):
    from lightbert.tasks.glue.data import label_to_number
    from lightbert.tasks.glue.tasks import glue_task

    with pytest.raises(UserError, match="train.csv, row 4: label"):
        label_to_number(given, 3, glue_task("sst2"), "train.csv")


def test_loader_workers_are_chosen_by_the_machine_and_said_once(monkeypatch, caplog):
    import logging

    from lightbert.data.batches import loader_workers

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert loader_workers("auto", cpu, 10_000) == 0  # the cores are the model's
    assert loader_workers("auto", cuda, 10) == 0  # a small split: starting workers costs more than it saves
    assert loader_workers("auto", cuda, 10_000) == 4
    assert loader_workers("auto", cuda, 10_000, local_devices=8) == 1  # 2 cores per GPU, one for the process
    assert loader_workers(3, cpu, 10) == 3  # a number is a number
    with pytest.raises(ConfigError, match="num_workers must be a number of processes"):
        loader_workers(-1, cpu, 10)

    module = GlueDataModule.__new__(GlueDataModule)
    module.num_workers, module._said_workers, module.trainer = "auto", False, None
    monkeypatch.setattr("lightbert.tasks.finetuning.datamodule.loader_workers", lambda *a: 4)
    with caplog.at_level(logging.INFO, logger="lightbert"):
        assert module.workers(500) == 4 and module.workers(500) == 4
    said = [r.getMessage() for r in caplog.records if "worker processes" in r.getMessage()]
    assert said == ["data loading: 4 worker processes per device (task.datamodule.num_workers=auto on cpu; set a "
                    "number to change it)"]  # fmt: skip


def test_evaluation_batches_are_longest_first_and_sized_for_the_device():
    """Validation and prediction loaders sort the split by length (each batch pads to its own longest); every example
    comes once, with its idx; null eval_batch_size is task.batch_size on a CPU and at least 256 on a GPU."""
    import datasets

    from lightbert.data.batches import PaddingCollator, evaluation_batch_size, longest_first, make_loader

    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 60, size=100)
    split = datasets.Dataset.from_dict(
        {"input_ids": [[7] * n for n in lengths], "token_type_ids": [[0] * n for n in lengths], "idx": list(range(100))}
    )
    ordered = longest_first(split)
    assert [len(ids) for ids in ordered["input_ids"]] == sorted(lengths.tolist(), reverse=True)
    assert sorted(ordered["idx"]) == list(range(100))
    collate = PaddingCollator(0, {"idx": ("idx", torch.long)}, pad_to_multiple_of=None)
    batches = list(make_loader(ordered, collate, 16, False, 0))
    widths = [b["input_ids"].shape[1] for b in batches]
    assert widths == sorted(widths, reverse=True)
    padded = sum(b["input_ids"].numel() for b in batches)
    in_file_order = sum(b["input_ids"].numel() for b in make_loader(split, collate, 16, False, 0))
    assert padded < 1.2 * lengths.sum() and in_file_order > 1.5 * lengths.sum(), (padded, in_file_order)
    multiple_choice = datasets.Dataset.from_dict({"input_ids": [[[1] * 4, [1] * 9], [[1] * 12, [1] * 2], [[1], [1]]]})
    assert [max(map(len, ids)) for ids in longest_first(multiple_choice)["input_ids"]] == [12, 9, 1]

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert evaluation_batch_size(None, 32, cpu) == 32 and evaluation_batch_size(None, 32, cuda) == 256
    assert evaluation_batch_size(None, 512, cuda) == 512 and evaluation_batch_size(64, 32, cuda) == 64
