"""`python -m lightbert.analysis.paper_tables`: the paper's ablation tables rebuilt exactly from the runs'
results.json files."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest
import yaml

from lightbert.analysis.paper_tables import PAPER_TABLE_5, PAPER_TABLE_8, main

SIZES = {"bert_tiny": (2, 128, 2), "bert_mini": (4, 256, 4)}


def write_job(path: Path, config: dict, results: dict) -> Path:
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (path / ".hydra" / "overrides.yaml").write_text("[]\n")
    (path / "results.json").write_text(json.dumps(results))
    return path


def pretrain_job(path: Path, objective="mlm_nsp", masking=(0.8, 0.1, 0.1), sizes=(2, 128, 2), mlm_loss=5.0) -> Path:
    layers, hidden, heads = sizes
    config = {
        "task": {
            "name": "pretrain",
            "objective": objective,
            "datamodule": {"masking": dict(zip(("mask", "same", "random"), masking, strict=True))},
        },
        "model": {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads},
    }
    return write_job(path, config, {"metrics": {"val/mlm_loss": mlm_loss}, "best_score": mlm_loss})


def finetune_job(path: Path, init_from: Path, task: str, best: float, bilstm: bool = False) -> Path:
    config = {"init_from": str(init_from), "task": {"name": task, "module": {"bilstm": bilstm}}}
    return write_job(path, config, {"best_score": best})


def report(tmp_path: Path) -> tuple[dict, str]:
    assert main([str(tmp_path / "pretrain"), str(tmp_path / "finetune")]) == 0
    return (
        json.loads((tmp_path / "pretrain" / "paper_tables.json").read_text()),
        (tmp_path / "pretrain" / "paper_tables.md").read_text(),
    )


def test_table_5_is_the_mean_and_std_of_each_objectives_seeds(tmp_path):
    rng = random.Random(0)
    scores: dict[tuple[str, str], list[float]] = {}
    job = 0
    for objective in ("ltr", "mlm", "mlm_nsp"):  # any order: the table has the paper's
        for _seed in range(3):
            run = pretrain_job(tmp_path / "pretrain" / str(job), objective=objective)
            for task in ("sst2", "mrpc"):
                best = rng.uniform(0.5, 0.9)
                finetune_job(tmp_path / "finetune" / f"{job}-{task}", run, task, best)
                scores.setdefault((objective, task), []).append(100 * best)
            if objective == "ltr":  # the + BiLSTM row: the same LTR jobs, fine-tuned with a BiLSTM on top
                best = rng.uniform(0.5, 0.9)
                finetune_job(tmp_path / "finetune" / f"{job}-bilstm", run, "sst2", best, bilstm=True)
                scores.setdefault(("ltr+bilstm", "sst2"), []).append(100 * best)
            job += 1
    result, text = report(tmp_path)
    rows = [r["row"] for r in result["rows"]]
    assert result["table"] == "table5" and rows == ["BERT (MLM + NSP)", "No NSP", "LTR & No NSP", "+ BiLSTM"]
    for row, objective in zip(result["rows"], ("mlm_nsp", "mlm", "ltr", "ltr+bilstm"), strict=True):
        for task in ("sst2", "mrpc") if objective != "ltr+bilstm" else ("sst2",):
            values = scores[(objective, task)]
            assert row["scores"][task] == {"mean": statistics.mean(values), "std": statistics.stdev(values), "n": 3}
        assert row["paper"] == PAPER_TABLE_5[objective]
        sst2 = scores[(objective, "sst2")]
        assert f"{statistics.mean(sst2):.1f} ± {statistics.stdev(sst2):.1f} (n=3)" in text
    assert "| sst2 (this study) | sst2 (paper) |" in text.replace("mrpc (this study) | mrpc (paper) | ", "")


def test_table_8_rows_are_the_masking_shares_in_the_paper_order(tmp_path):
    for job, shares in enumerate(reversed(list(PAPER_TABLE_8))):
        run = pretrain_job(tmp_path / "pretrain" / str(job), masking=shares)
        finetune_job(tmp_path / "finetune" / str(job), run, "conll2003", 0.5 + job / 100)
    result, text = report(tmp_path)
    assert result["table"] == "table8"
    assert [r["row"] for r in result["rows"]][:2] == ["80% / 10% / 10%", "100% / 0% / 0%"]
    assert result["rows"][0]["scores"]["conll2003"]["mean"] == pytest.approx(55.0)  # the last job written
    assert "| 80% / 10% / 10% | 55.0 ± 0.0 (n=1) | 95.4 |" in text


def test_table_6_adds_the_held_out_mlm_perplexity(tmp_path):
    losses = {"bert_tiny": [4.0, 4.2], "bert_mini": [3.0, 3.4]}
    job = 0
    for name, values in losses.items():
        for loss in values:
            run = pretrain_job(tmp_path / "pretrain" / str(job), sizes=SIZES[name], mlm_loss=loss)
            finetune_job(tmp_path / "finetune" / str(job), run, "sst2", 0.7)
            job += 1
    result, _ = report(tmp_path)
    assert result["table"] == "table6"
    by_row = {r["row"]: r for r in result["rows"]}
    assert by_row["L=2 H=128 A=2"]["perplexity"] == pytest.approx(math.exp(4.1))
    assert by_row["L=4 H=256 A=4"]["perplexity"] == pytest.approx(math.exp(3.2))


def test_figure_5_from_checkpoints_along_one_run(tmp_path):
    run = pretrain_job(tmp_path / "pretrain" / "0")
    for number, step in enumerate((100, 200, 300)):
        checkpoint = run / "checkpoints" / f"step{step}.ckpt"
        finetune_job(tmp_path / "finetune" / str(number), checkpoint, "sst2", 0.6 + step / 10_000)
    result, text = report(tmp_path)
    assert result["table"] == "figure5" and [r["step"] for r in result["rows"]] == [100, 200, 300]
    assert [r["scores"]["sst2"]["mean"] for r in result["rows"]] == pytest.approx([61, 62, 63])
    assert (tmp_path / "pretrain" / "figure5.png").stat().st_size > 0 and "figure5.png" in text


def test_fine_tuning_that_started_elsewhere_is_one_clear_error(tmp_path, capsys):
    pretrain_job(tmp_path / "pretrain" / "0")
    finetune_job(tmp_path / "finetune" / "0", tmp_path / "elsewhere", "sst2", 0.7)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "pretrain"), str(tmp_path / "finetune")])
    assert exit_info.value.code == 2
    assert "no fine-tuning job started from one of the pre-training jobs" in capsys.readouterr().err
