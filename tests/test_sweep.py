"""Multirun sweeps: summary.csv/summary.md after every sweep, failed jobs included, mean ± std over seeds."""

import csv
import json
import statistics
import sys
from pathlib import Path

import pytest
import yaml
from helpers.glue_files import glue_data_files
from helpers.models import write_hf_bert
from helpers.runs import CONF_DIR, run_train_forked, run_train_script

from lightbert.analysis.sweep import write_summary


def fake_job(sweep_dir, num: int, overrides: list[str], best: float | None, task: str = "rte"):
    job = sweep_dir / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {"task": {"name": task, "monitor": "val/score", "monitor_mode": "max"}}
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    if best is None:
        (job / "failed.txt").write_text("UserError: something\n")
    else:
        (job / "results.json").write_text(json.dumps({"monitor": "val/score", "best_score": best, "seconds": 1.0}))


def test_summary_lists_every_job_the_best_and_mean_std_over_seeds(tmp_path):
    scores = {("2e-5", 1): 0.61, ("2e-5", 2): 0.65, ("5e-5", 1): 0.70, ("5e-5", 2): 0.66}
    for num, ((lr, seed), best) in enumerate(scores.items()):
        fake_job(tmp_path, num, ["task=glue/rte", f"optim.lr={lr}", f"seed={seed}"], best)
    fake_job(tmp_path, 4, ["task=glue/rte", "optim.lr=9e-5", "seed=1"], None)
    write_summary(tmp_path)
    rows = list(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert [r["status"] for r in rows] == ["ok"] * 4 + ["failed"]
    assert rows[2]["optim.lr"] == "5e-5" and float(rows[2]["best"]) == 0.70
    md = (tmp_path / "summary.md").read_text()
    best_section = md.split("## Best configuration per task")[1].split("##")[0]
    assert "| rte | 2 | optim.lr=5e-5 seed=1 | val/score | 0.7000 |" in best_section
    mean, std = statistics.mean([0.70, 0.66]), statistics.stdev([0.70, 0.66])
    assert f"| rte | optim.lr=5e-5 | 2 | val/score | {mean:.4f} ± {std:.4f} |" in md


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("hf") / "bert")


def run_sweep(task: str, hf_dir, tmp_path, *overrides: str, multirun: bool = True):
    """`python src/train.py [-m]` on a small local GLUE task with OVERRIDES; returns the result and summary.csv."""
    files = glue_data_files(tmp_path / "data", task, "tsv")
    sweep = tmp_path / "sweep"
    command = [
        *(["-m"] if multirun else []),  # before the overrides, or Hydra's parser refuses them
        f"task=glue/{task}",
        f"init_from={hf_dir}",
        f"task.data_files.train={files['train']}",
        f"task.data_files.validation={files['validation']}",
        "trainer=cpu",
        "task.datamodule.num_workers=0",
        f"hydra.sweep.dir={sweep}",
        *overrides,
    ]
    if "sweep=optuna" in overrides:  # the optuna extra, which the install of helpers.runtime leaves out
        result = run_train_script(*command, python=sys.executable)
    else:
        result = run_train_forked(*command)
    summary = sweep / "summary.csv"
    rows = list(csv.DictReader(summary.read_text().splitlines())) if summary.is_file() else []
    return result, rows, sweep


@pytest.mark.slow
def test_multirun_over_learning_rates_ends_with_a_summary_of_both_jobs(hf_dir, tmp_path):
    result, rows, sweep = run_sweep("sst2", hf_dir, tmp_path, "optim.lr=2e-5,5e-5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(float(r["optim.lr"]), r["status"]) for r in rows] == [(2e-5, "ok"), (5e-5, "ok")]
    assert all(r["monitor"] == "val/score" and r["best"] for r in rows)
    md = (sweep / "summary.md").read_text()
    assert "| 0 | sst2 | ok | 2e-05 |" in md and "| 1 | sst2 | ok | 5e-05 |" in md
    # Each job is its own W&B run (offline here) in its own directory.
    assert all(list((sweep / job / "wandb").glob("offline-run-*")) for job in ("0", "1"))
    # The end of the command says where the summary is and which configuration won.
    assert f"lightbert: 2 jobs, 0 failed; summary in {sweep / 'summary.md'}" in result.stdout
    best = max(rows, key=lambda r: float(r["best"]))
    assert f"lightbert: best sst2: job {best['job']} (optim.lr={best['optim.lr']})" in result.stdout


@pytest.mark.slow
def test_a_failed_job_does_not_stop_the_sweep_and_is_in_the_summary(hf_dir, tmp_path):
    # max_seq_length 4 is refused: the first job fails
    result, rows, sweep = run_sweep("rte", hf_dir, tmp_path, "task.max_seq_length=4,32", "logger=csv")
    assert result.returncode != 0 and "max_seq_length must be at least 8" in result.stderr
    assert [(r["task.max_seq_length"], r["status"]) for r in rows] == [("4", "failed"), ("32", "ok")]
    assert "max_seq_length" in rows[0]["error"]
    job_rows = [line for line in (sweep / "summary.md").read_text().splitlines() if line.startswith("| 0 |")]
    assert "max_seq_length must be at least 8" in job_rows[0]  # summary.md says why the job failed
    assert "lightbert: 2 jobs, 1 failed; summary in" in result.stdout


@pytest.mark.slow
def test_optuna_sweep_runs_its_trials(hf_dir, tmp_path):
    result, rows, _ = run_sweep(
        "mrpc", hf_dir, tmp_path, "sweep=optuna", "hydra.sweeper.n_trials=2", "logger=csv", multirun=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(rows) == 2 and all(r["status"] == "ok" and r["best"] for r in rows)
    assert all(2e-5 <= float(r["optim.lr"]) <= 5e-5 for r in rows)


def test_every_multirun_job_is_its_own_wandb_run_in_the_sweeps_group(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    from lightbert.plugins.loggers import wandb_logger

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["task=glue/rte"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(tmp_path / "sweep")
        cfg.hydra.job.num = 3
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        logger = wandb_logger(
            project="lightbert", save_dir=str(tmp_path / "run"), name="rte-bert", tags=["rte", None], mode="disabled"
        )
    finally:
        HydraConfig.instance().cfg = previous  # later tests see no multirun
    assert logger._wandb_init["group"] == "rte-bert-sweep"  # the run name and the sweep directory's name
    assert logger._wandb_init["name"] == "rte-bert-3"
    assert logger._wandb_init["tags"] == ["rte", "multirun"] and logger._wandb_init["job_type"] == "multirun"


@pytest.mark.slow
def test_report_turns_a_real_multirun_into_linked_plots_that_show_its_results(hf_dir, tmp_path):
    import matplotlib.image

    from lightbert.analysis.report import grid_figure, main, mean_by_config, swept_keys
    from lightbert.analysis.sweep import job_rows

    result, _, sweep = run_sweep(
        "sst2",
        hf_dir,
        tmp_path,
        "optim.lr=2e-5,5e-4",
        "task.batch_size=8,16",
        "seed=1,2",
        "trainer.max_epochs=1",
        "logger=csv",
        "trainer.log_every_n_steps=1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert main([str(sweep)]) == 0
    pngs = ["grid_sst2.png", "seeds_sst2.png", "curves_sst2.png"]
    for name in pngs:
        image = matplotlib.image.imread(sweep / name)
        assert image.shape[0] > 200 and image.shape[1] > 300  # a real figure, not an empty file
        assert image[..., :3].std() > 0.05  # something is drawn on it
    md = (sweep / "summary.md").read_text()
    assert "## Jobs" in md  # the summary is still there, the plots linked after it
    assert md.split("## Plots")[1].split() == [f"![{Path(n).stem}]({n})" for n in pngs]
    # The heat map holds, per (lr, batch) cell, the mean over seeds of the jobs' best scores in results.json.
    jobs = job_rows(sweep)
    assert swept_keys(jobs) == ["optim.lr", "task.batch_size"]
    figure = grid_figure(jobs, "sst2")
    cells = figure.axes[0].images[0].get_array()
    for i, lr in enumerate(["2e-05", "0.0005"]):
        for j, batch in enumerate(["8", "16"]):
            scores = [
                json.loads((sweep / r["job"] / "results.json").read_text())["best_score"]
                for r in jobs
                if r["overrides"]["optim.lr"] == lr and r["overrides"]["task.batch_size"] == batch
            ]
            assert len(scores) == 2  # two seeds
            assert cells[i, j] == pytest.approx(statistics.mean(scores))
            assert mean_by_config(jobs, ["optim.lr", "task.batch_size"])[(lr, batch)] == pytest.approx(cells[i, j])
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2


def test_report_names_a_directory_that_is_not_a_sweep(tmp_path, capsys):
    from lightbert.analysis.report import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "holds no multirun jobs" in capsys.readouterr().err


def test_report_keeps_the_papers_order_marks_failed_jobs_and_never_draws_an_empty_panel(tmp_path):
    from lightbert.analysis.report import curves_figure, grid_figure

    def row(job, features, best, status="ok"):
        overrides = {"task.features": features}
        return {
            "job": job,
            "task": "conll2003",
            "status": status,
            "overrides": overrides,
            "monitor": "val/f1",
            "mode": "max",
            "best": best,
            "seconds": 1.0,
            "error": "" if best is not None else "ConfigError: x",
        }

    rows = [row("0", "last", 0.5), row("1", "embeddings", 0.3), row("2", "concat_last_four", None, "failed")]
    ax = grid_figure(rows, "conll2003").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["embeddings", "last", "concat_last_four"]  # Table 7's
    assert "failed" in [t.get_text() for t in ax.texts]  # not a bar that reads as 0.0
    for job in ("0", "1"):  # short runs: validation metrics only, no train/loss row
        (tmp_path / job).mkdir()
        (tmp_path / job / "metrics.csv").write_text("epoch,step,val/f1\n0,5,0.4\n")
    train_axis, val_axis = curves_figure(tmp_path, rows[:2], "conll2003").axes
    assert [t.get_text() for t in train_axis.texts] == [
        "no train/loss logged:\nruns shorter than trainer.log_every_n_steps"
    ]
    assert val_axis.get_legend() is not None and len(val_axis.lines) == 2


def test_a_job_that_raised_is_listed_as_failed_with_its_error(tmp_path):
    """A multirun job that raised (not a refusal): the summary names it failed, with the error and its overrides."""
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from lightbert.analysis.sweep import FAILED_FILE, SweepSummary

    job_dir = tmp_path / "0"
    job_dir.mkdir()
    config = OmegaConf.create(
        {
            "hydra": {
                "mode": RunMode.MULTIRUN,
                "runtime": {"output_dir": str(job_dir)},
                "sweep": {"dir": str(tmp_path)},
                "overrides": {"task": ["trainer.val_check_interval=2"]},
            }
        }
    )
    failed = JobReturn(status=JobStatus.FAILED, _return_value=ZeroDivisionError("division by zero"))
    SweepSummary().on_job_end(config, failed)
    assert (job_dir / FAILED_FILE).read_text() == "ZeroDivisionError: division by zero\n"
    assert "trainer.val_check_interval=2" in (job_dir / ".hydra" / "overrides.yaml").read_text()
