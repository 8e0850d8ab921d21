"""experiment=glue_benchmark / squad_benchmark: the jobs it plans, the paper's tables from the jobs' results, the GLUE
server's submission.zip, and the whole command end to end on small files of all nine GLUE tasks and both SQuADs."""

import json
import os
import shutil
import statistics
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from helpers.glue_files import write_glue_file
from helpers.models import write_hf_bert
from helpers.runs import compose_config, run_train_forked, snapshot
from helpers.squad_files import squad_articles, write_official

from lightbert.analysis.benchmark import AVERAGED, COLUMNS, PAPER_ROWS, build, glue_average, main, write_tables
from lightbert.analysis.benchmark import write_submissions as submissions
from lightbert.analysis.benchmark_plan import PLAN_FILE, BenchmarkJob, checkpoint_key, plan
from lightbert.cluster import processes
from lightbert.errors import UserError
from lightbert.tasks.glue.tasks import TASKS

GLUE_SPLITS = {name: ["train", *spec.validation_splits, *spec.test_splits] for name, spec in TASKS.items()}
SERVER_FILES = {"CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "QNLI.tsv",
                "RTE.tsv", "WNLI.tsv", "AX.tsv"}  # fmt: skip


# -- the average ------------------------------------------------------------------------------------------------------


def test_the_average_is_the_papers_own_definition_over_table_1s_columns():
    for name, row in PAPER_ROWS["glue"].items():
        assert round(glue_average({t: row[t] for t in AVERAGED}), 1) == row["average"], name


def test_the_average_counts_mnli_twice_and_a_two_metric_task_as_the_mean_of_its_two():
    cells = {t: [60.0] for t in AVERAGED}
    cells |= {"mnli": [80.0, 82.0], "qqp": [70.0, 90.0], "mrpc": [88.0, 84.0], "wnli": [10.0]}
    expected = statistics.mean([80.0, 82.0, 80.0, 60.0, 60.0, 60.0, 60.0, 86.0, 60.0])  # WNLI never counts
    assert glue_average(cells) == pytest.approx(expected)
    del cells["rte"]
    assert glue_average(cells) is None  # not until all eight tasks have a score


# -- results.json's best_metrics -----------------------------------------------------------------------------------


def test_best_metrics_are_those_of_the_validation_the_kept_checkpoint_comes_from(tmp_path):
    from lightbert.run.outputs import best_validation_metrics

    rows = ["epoch,step,train/loss,val/accuracy,val/f1,val/score", "0,1,0.7,,,", "0,1,,0.5,0.25,0.375",
            "1,3,,0.75,0.5,0.625", "2,5,,0.5,0.75,0.625", "3,7,,0.5,0.5,0.5"]  # fmt: skip
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    best = best_validation_metrics(tmp_path / "metrics.csv", "val/score", 0.625)
    assert best == {"val/accuracy": 0.75, "val/f1": 0.5, "val/score": 0.625}  # the first of two equal: the one kept
    assert best_validation_metrics(tmp_path / "metrics.csv", "val/score", 0.9) is None
    assert best_validation_metrics(tmp_path / "none.csv", "val/score", 0.625) is None


# -- the plan -----------------------------------------------------------------------------------------------------


def glue_plan(tmp_path, *overrides: str, combinations=None) -> list[BenchmarkJob]:
    cfg = compose_config(["experiment=glue_benchmark", "init_from=bert-base-uncased", *overrides], tmp_path)
    given = [o for o in overrides if not o.startswith("benchmark.")]
    return plan(cfg, combinations or [["init_from=bert-base-uncased", *given]])


def test_the_paper_grid_runs_every_task_and_restarts_only_the_small_ones(tmp_path):
    jobs = glue_plan(tmp_path, "benchmark.restarts=3")
    per_task = {t: [j for j in jobs if j.task == t] for t in dict.fromkeys(j.task for j in jobs)}
    assert list(per_task) == ["mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte"]  # Table 1's, no WNLI
    for task, task_jobs in per_task.items():
        restarts = 3 if task in ("rte", "mrpc", "stsb", "cola") else 1
        assert len(task_jobs) == 24 * restarts
        assert {j.seed for j in task_jobs} == set(range(12345, 12345 + restarts))
        assert {tuple(j.configuration.values()) for j in task_jobs} == {
            (lr, batch, epochs) for lr in (5e-5, 4e-5, 3e-5, 2e-5) for batch in (16, 32) for epochs in (2, 3, 4)
        }
    assert len({j.name for j in jobs}) == len(jobs) == 8 * 24 + 4 * 24 * 2
    job = per_task["rte"][0]
    assert job.overrides[:5] == ["task=glue/rte", "optim.lr=5e-05", "task.batch_size=16", "trainer.max_epochs=2",
                                 "seed=12345"]  # fmt: skip
    assert job.name == f"{checkpoint_key('bert-base-uncased')}-rte-lr5e-05-b16-e2-s12345"


def test_fast_grid_wnli_and_a_key_the_command_line_sets(tmp_path):
    fast = glue_plan(tmp_path, "benchmark.grid=fast", "benchmark.wnli=true")
    assert len(fast) == 9 * 4 and {j.configuration["task.batch_size"] for j in fast} == {32}
    assert fast[-1].task == "wnli"
    fixed = glue_plan(tmp_path, "optim.lr=2e-5")  # replaces the grid's four learning rates
    assert len(fixed) == 8 * 6 and all("optim.lr" not in j.configuration for j in fixed)
    assert all(j.overrides[-1] == "optim.lr=2e-5" for j in fixed)


def test_several_checkpoints_are_one_table_row_each_and_never_share_a_directory(tmp_path):
    a, b = write_hf_bert(tmp_path / "a" / "bert"), write_hf_bert(tmp_path / "b" / "bert")
    combinations = [["experiment=glue_benchmark", f"init_from={p}"] for p in (a, b)]
    jobs = glue_plan(tmp_path, "benchmark.grid=fast", combinations=combinations)
    assert {j.checkpoint for j in jobs} == {str(a), str(b)}
    assert len({j.name for j in jobs}) == len(jobs) == 2 * 8 * 4
    assert checkpoint_key(str(a)) != checkpoint_key(str(b)) and checkpoint_key(str(a)).startswith("bert-")
    assert checkpoint_key(str(a)) == checkpoint_key(str(a / ".." / "bert"))  # the same checkpoint, however named


@pytest.mark.parametrize(
    ("overrides", "combination", "said"),
    [
        (["benchmark.grid=slow"], [], "benchmark.grid=slow is not one of this benchmark's grids: paper, fast"),
        (["benchmark.tasks=[rte,boolq]"], [], "(boolq is not one)"),
        (["benchmark.restarts=0"], [], "benchmark.restarts=0 must be a whole number of seeds, 1 or more"),
        ([], ["task=glue/rte"], "task= is chosen by experiment=glue_benchmark itself"),
        (["benchmark.data_dir=/nonexistent"], [], "benchmark.data_dir=/nonexistent is not a directory"),
        # A job would fail on the key; and an empty list plans no job at all, which used to exit 0.
        (["benchmark.grid=fast", "+benchmark.grids.fast.optim.lrr=[1e-5]"], [],
         "benchmark.grids.fast: optim.lrr is not a config key (did you mean optim.lr?)"),
        (["benchmark.grids.paper={optim.lr:[],task.batch_size:[16]}"], [], "benchmark.grids.paper: optim.lr is empty"),
        (["benchmark.grids.paper={optim.lr:2e-5}"], [], "benchmark.grids.paper: optim.lr=2e-05 must be a list"),
        (["trainer.limit_val_batches=0"], [], "trainer.limit_val_batches=0 runs no validation"),
    ],
)  # fmt: skip
def test_a_bad_benchmark_setting_is_one_message_naming_it(tmp_path, overrides, combination, said):
    with pytest.raises(UserError) as error:
        glue_plan(tmp_path, *overrides, combinations=[["init_from=x", *combination]])
    assert said in str(error.value)


def test_a_grid_key_the_command_line_adds_is_one_key_of_the_grid(tmp_path):
    """`+benchmark.grids.fast.optim.weight_decay=[...]`, the form a misspelt key is told to take, nests the key
    ({optim: {weight_decay: [...]}}): it is the config key optim.weight_decay, swept with the grid's others."""
    jobs = glue_plan(
        tmp_path, "benchmark.grid=fast", "benchmark.tasks=[rte]", "+benchmark.grids.fast.optim.weight_decay=[0.0,0.1]"
    )
    assert len(jobs) == 4 * 2
    assert {j.configuration["optim.weight_decay"] for j in jobs} == {0.0, 0.1}
    assert "optim.weight_decay=0.1" in jobs[1].overrides and jobs[1].name.endswith("-weight_decay0.1-s12345")


def test_each_tasks_files_are_found_once_under_the_names_the_benchmark_reads(tmp_path):
    """A validation file under another name (the GLUE download's dev.tsv) is refused before any job, naming the file
    the benchmark reads and the key the user sets; SQuAD's folder is asked for in SQuAD's formats only."""
    data = tmp_path / "glue"
    write_glue_file(data / "rte" / "train.tsv", "rte", 8)
    write_glue_file(data / "rte" / "dev.tsv", "rte", 8)
    with pytest.raises(UserError) as error:
        glue_plan(tmp_path, f"benchmark.data_dir={data}", "benchmark.tasks=[rte]")
    assert str(error.value) == (
        f"benchmark.data_dir={data} has no validation file for rte ({data / 'rte'} holds dev.tsv, train.tsv): write "
        f"it as {data / 'rte' / 'validation.tsv'} (or .csv, .json, .jsonl, .parquet), or leave benchmark.data_dir "
        "unset to read the hub's data"
    )
    (data / "rte" / "dev.tsv").rename(data / "rte" / "validation.tsv")
    (job,) = glue_plan(tmp_path, f"benchmark.data_dir={data}", "benchmark.tasks=[rte]", "optim.lr=2e-5",
                       "task.batch_size=32", "trainer.max_epochs=3")  # fmt: skip
    assert [o for o in job.overrides if o.startswith("task.data_files.")] == [
        f"task.data_files.train={data / 'rte' / 'train.tsv'}",
        f"task.data_files.validation={data / 'rte' / 'validation.tsv'}",
    ]  # no test file: a job without test predictions, as before
    squad = tmp_path / "squad"
    squad.mkdir()
    cfg = compose_config(["experiment=squad_benchmark", "init_from=x", f"benchmark.data_dir={squad}"], tmp_path)
    with pytest.raises(UserError) as error:
        plan(cfg, [["init_from=x"]])
    assert f"write it as {squad / 'squad_v1' / 'train.json'} (or .jsonl, .parquet)" in str(error.value)
    assert ".tsv" not in str(error.value) and ".csv" not in str(error.value)


def test_a_directory_holds_one_family_of_benchmark(tmp_path):
    from lightbert.analysis.benchmark_plan import record_plan

    squad_job = BenchmarkJob("c-squad_v1-s1", "squad", "squad_v1", "c", {}, 1, [])
    write_plan(tmp_path, "squad", [squad_job])
    before = (tmp_path / PLAN_FILE).read_text()
    with pytest.raises(UserError, match="holds a squad benchmark; run experiment=glue_benchmark into another"):
        record_plan(tmp_path, "glue", [glue_job("rte", 2e-5, 1)])
    assert (tmp_path / PLAN_FILE).read_text() == before
    record_plan(tmp_path, "squad", [BenchmarkJob("d-squad_v1-s1", "squad", "squad_v1", "d", {}, 1, [])])
    assert set(json.loads((tmp_path / PLAN_FILE).read_text())["jobs"]) == {"c-squad_v1-s1", "d-squad_v1-s1"}


def test_a_refused_benchmark_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_train_forked("experiment=glue_benchmark", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "lightbert: error: experiment=glue_benchmark fine-tunes one pre-trained model: give init_from=<a lightbert "
        ".ckpt or run directory, a Hugging Face directory, or a hub id such as bert-base-uncased>"
    )
    assert not sweep.exists()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("model") / "bert")


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("init_from", "init_from={tmp}/missing does not exist; give a .ckpt file, a run directory or a model"),
        ("grid_key", "benchmark.grids.fast: optim.lrr is not a config key (did you mean optim.lr?)"),
        ("dev_tsv", "has no validation file for rte ({tmp}/glue/rte holds dev.tsv, train.tsv)"),
    ],
)  # fmt: skip
def test_a_benchmark_is_refused_before_any_job_in_one_line(tmp_path, tiny_bert, case, said):
    """What every job would fail on is found once, before the sweep directory is made: one line, exit 2, nothing
    written (a missing init_from used to print its error once per job, and leave their directories and tables)."""
    data = tmp_path / "glue"
    write_glue_file(data / "rte" / "train.tsv", "rte", 8)
    write_glue_file(data / "rte" / ("dev.tsv" if case == "dev_tsv" else "validation.tsv"), "rte", 8)
    command = {
        "init_from": [f"init_from={tmp_path / 'missing'}"],
        "grid_key": [f"init_from={tiny_bert}", "+benchmark.grids.fast.optim.lrr=[1e-5]"],
        "dev_tsv": [f"init_from={tiny_bert}"],
    }[case]
    sweep = tmp_path / "sweep"
    before = snapshot(tmp_path)
    result = run_train_forked(
        "experiment=glue_benchmark", "benchmark.grid=fast", "benchmark.tasks=[rte]", f"benchmark.data_dir={data}",
        *command, *TINY, f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert line.startswith("lightbert: error: ") and said.format(tmp=tmp_path) in line
    assert not sweep.exists() and snapshot(tmp_path) == before


def test_a_second_benchmark_into_a_running_ones_directory_writes_nothing(tmp_path, tiny_bert):
    """The running benchmark holds its sweep directory: a second command into it is refused in one line before it
    writes anything (it used to run into the first one's jobs, mark a finished one failed, and rewrite its tables)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hydra_plugins.lightbert_benchmark.benchmark_sweeper import _hold

    sweep = tmp_path / "sweep"
    # TINY sets every key of the fast grid: one job, named and recorded as the sweeper plans it.
    command = ["experiment=glue_benchmark", f"init_from={tiny_bert}", "benchmark.tasks=[rte]", "benchmark.grid=fast",
               "logger=csv", *TINY, f"hydra.sweep.dir={sweep}"]  # fmt: skip
    cfg = compose_config(command, tmp_path)
    # The command line as the sweeper reads it (Hydra's parser writes 1e-3 as 0.001), for the overrides recorded.
    arguments = OverridesParser.create().parse_overrides([o for o in command if not o.startswith("hydra.")])
    (job,) = plan(cfg, BasicSweeper.split_arguments(arguments, None)[0])
    write_plan(sweep, "glue", [job])
    fake_job(sweep, job, 0.6, metrics_of("rte", 0.6))  # its one job finished: the second command has none to run
    before = snapshot(sweep)
    held = _hold(sweep)  # as the first benchmark's process holds it
    try:
        result = run_train_forked(*command)
    finally:  # let go as the process's end would: no longer closed in this worker's children (the fd is reused)
        processes.release(held)
        os.close(held)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"lightbert: error: another benchmark is running in {sweep} right now; wait for it to finish (the same "
        "command then skips its finished jobs), or run this one into another directory with hydra.sweep.dir=..."
    ]
    assert snapshot(sweep) == before


# -- the tables and the submission, from fabricated jobs ---------------------------------------------------------------


def fake_job(sweep: Path, job: BenchmarkJob, best_score: float | None, metrics: dict, tsvs: bool = True) -> None:
    """A finished job's directory as a benchmark job leaves it: results.json (or failed.txt), predictions/."""
    directory = sweep / job.name
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(job.overrides))
    if best_score is None:
        (directory / "failed.txt").write_text("RuntimeError: out of memory\n")
        return
    results = {"monitor": "val/score", "best_score": best_score, "best_metrics": metrics, "metrics": {}}
    if job.family == "squad":
        (directory / "predictions").mkdir()
        (directory / "predictions" / "eval.json").write_text(json.dumps(metrics))
    elif tsvs:
        (directory / "predictions").mkdir()
        for name in TASKS[job.task].submission_files:
            (directory / "predictions" / name).write_text(f"index\tprediction\n0\t{job.name}\n")
        results["predictions"] = [str(directory / "predictions" / n) for n in TASKS[job.task].submission_files]
    (directory / "results.json").write_text(json.dumps(results))


def write_plan(sweep: Path, family: str, jobs: list[BenchmarkJob]) -> None:
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / PLAN_FILE).write_text(json.dumps({"family": family, "jobs": {j.name: asdict(j) for j in jobs}}))


def glue_job(task: str, lr: float, seed: int, checkpoint: str = "ckpt") -> BenchmarkJob:
    name = f"{checkpoint}-{task}-lr{lr}-s{seed}"
    return BenchmarkJob(name, "glue", task, checkpoint, {"optim.lr": lr}, seed, [f"task=glue/{task}", f"seed={seed}"])


def metrics_of(task: str, base: float) -> dict[str, float]:
    """Distinct made-up values for each metric of a task's column, as fractions (best_metrics' unit)."""
    names = dict((t, m) for t, _, m in COLUMNS["glue"])[task]
    return {name: base + 0.01 * i for i, name in enumerate(names)} | {"val/loss": 0.5}


@pytest.fixture
def glue_sweep(tmp_path):
    """All nine tasks, one configuration each, except RTE: lr 1e-5 has the best single seed, lr 3e-5 the best mean."""
    sweep = tmp_path / "sweep"
    jobs, scores = [], {}
    for n, task in enumerate(TASKS):
        if task != "rte":
            jobs.append(glue_job(task, 2e-5, 1))
            scores[jobs[-1].name] = 0.5 + 0.03 * n
    for lr, seed, score in ((1e-5, 1, 0.90), (1e-5, 2, 0.50), (3e-5, 1, 0.80), (3e-5, 2, 0.76)):
        jobs.append(glue_job("rte", lr, seed))
        scores[jobs[-1].name] = score
    write_plan(sweep, "glue", jobs)
    for job in jobs:
        fake_job(sweep, job, scores[job.name], metrics_of(job.task, scores[job.name]))
    return sweep, jobs


def test_the_table_holds_each_tasks_best_configuration_as_results_json_says(glue_sweep):
    sweep, _ = glue_sweep
    table = write_tables(sweep)
    (row,) = table["rows"]
    for cell in row["tasks"].values():
        results = [json.loads((sweep / name / "results.json").read_text()) for name in cell["jobs"]]
        for i, name in enumerate(cell["metric_names"]):
            values = [100 * r["best_metrics"][name] for r in results]
            assert cell["metrics"][i]["mean"] == pytest.approx(statistics.mean(values))
    rte = row["tasks"]["rte"]
    assert rte["configuration"] == {"optim.lr": 3e-5} and rte["seeds"] == [1, 2]  # the best mean, not the best seed
    assert rte["metrics"][0]["mean"] == pytest.approx(78.0) and rte["metrics"][0]["std"] == pytest.approx(2.8284, 1e-3)
    assert rte["best_job"] == "ckpt-rte-lr3e-05-s1"  # the submission's: the better seed of that configuration
    assert row["tasks"]["sst2"]["metrics"][0]["std"] is None  # one seed: no spread
    cells = {t: [m["mean"] for m in c["metrics"]] for t, c in row["tasks"].items()}
    assert row["average"] == pytest.approx(glue_average(cells))
    md = (sweep / "glue_table.md").read_text()
    assert "| `ckpt` | " in md and "78.0 ± 2.8 |" in md and "| WNLI (acc) |" in md
    assert "| BERT_BASE (paper Table 1, GLUE test set) | 84.6/83.4 | 71.2 | 90.5 |" in md
    assert json.loads((sweep / "glue_table.json").read_text()) == json.loads(json.dumps(table))


def test_an_interrupted_benchmark_shows_what_is_done(tmp_path):
    sweep = tmp_path / "sweep"
    jobs = [glue_job("rte", 2e-5, 1), glue_job("rte", 3e-5, 1), glue_job("mrpc", 2e-5, 1), glue_job("cola", 2e-5, 1)]
    write_plan(sweep, "glue", jobs)
    fake_job(sweep, jobs[0], 0.6, metrics_of("rte", 0.6))
    fake_job(sweep, jobs[2], None, {})  # failed; cola not started
    (row,) = build(sweep)["rows"]
    assert (row["finished"], row["failed"], row["planned"]) == (1, 1, 4)
    assert list(row["tasks"]) == ["rte"] and row["tasks"]["rte"]["finished"] == 1 and row["average"] is None
    write_tables(sweep)
    lines = (sweep / "glue_table.md").read_text().splitlines()
    assert lines[4] == "| model | CoLA (MCC) | MRPC (F1/acc) | RTE (acc) | Average | jobs |"
    assert lines[6] == "| `ckpt` | - | - | 60.0 | - | 1/4, 1 failed |"


def test_submission_zip_holds_every_servers_file_from_each_tasks_best_job(glue_sweep):
    sweep, _ = glue_sweep
    written, notes = submissions(sweep, build(sweep))
    assert written == [sweep / "submission.zip"] and notes == []
    with zipfile.ZipFile(sweep / "submission.zip") as archive:
        assert set(archive.namelist()) == SERVER_FILES
        assert archive.read("RTE.tsv").decode().endswith("ckpt-rte-lr3e-05-s1\n")
        assert archive.read("AX.tsv").decode().endswith("ckpt-mnli-lr2e-05-s1\n")  # the MNLI model's


def test_without_wnli_the_zip_says_so_and_a_task_without_test_predictions_is_refused(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    jobs = [glue_job("rte", 2e-5, 1), glue_job("mrpc", 2e-5, 1)]
    write_plan(sweep, "glue", jobs)
    fake_job(sweep, jobs[0], 0.6, metrics_of("rte", 0.6))
    fake_job(sweep, jobs[1], 0.7, metrics_of("mrpc", 0.7), tsvs=False)
    with pytest.raises(SystemExit) as exit_info:
        main([str(sweep)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lightbert: error: no submission.zip for ckpt: mrpc's best job")
    assert "has no test predictions for test (MRPC.tsv)" in err[0]
    assert not (sweep / "submission.zip").exists() and (sweep / "glue_table.md").is_file()
    (sweep / jobs[1].name / "predictions").mkdir()
    (sweep / jobs[1].name / "predictions" / "MRPC.tsv").write_text("index\tprediction\n")
    assert main([str(sweep)]) == 0
    assert "WNLI.tsv is not in it (benchmark.wnli=false, as in the paper)" in capsys.readouterr().out
    assert set(zipfile.ZipFile(sweep / "submission.zip").namelist()) == {"RTE.tsv", "MRPC.tsv"}


def test_a_task_whose_jobs_ran_no_validation_is_named_with_the_cause(tmp_path, capsys):
    """A job that ran no validation has a results.json, so the same command skips it: "run it again to finish it"
    was advice that changed nothing. The table counts it, and the refusal names what its config did."""
    sweep = tmp_path / "sweep"
    jobs = [glue_job("rte", 2e-5, 1)]
    write_plan(sweep, "glue", jobs)
    fake_job(sweep, jobs[0], 0.6, {})
    results = json.loads((sweep / jobs[0].name / "results.json").read_text())
    (sweep / jobs[0].name / "results.json").write_text(json.dumps(results | {"best_score": None, "global_step": 4}))
    config = {"trainer": {"check_val_every_n_epoch": 3, "max_epochs": 2, "limit_val_batches": None}}
    (sweep / jobs[0].name / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit):
        main([str(sweep)])
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("lightbert: error: no submission.zip for ckpt: rte's 1 finished job(s) have no validation")
    assert "ran with trainer.check_val_every_n_epoch=3, more than its trainer.max_epochs=2" in err
    assert "run the same benchmark command again" not in err
    assert "| `ckpt` | - | - | 0/1, 1 without a validation score |" in (sweep / "glue_table.md").read_text()


@pytest.mark.parametrize("damage", ["deleted", "empty"])
def test_prediction_files_gone_or_empty_since_the_job_refuse_the_zip_and_remove_the_old_one(tmp_path, capsys, damage):
    """A predictions/ folder deleted after the job is not blamed on a job "without that test file", and a 0-byte
    file does not go into the zip; the submission.zip from before, which no longer matches, does not stay."""
    sweep = tmp_path / "sweep"
    jobs = [glue_job("sst2", 2e-5, 1), glue_job("rte", 2e-5, 1)]
    write_plan(sweep, "glue", jobs)
    for job in jobs:
        fake_job(sweep, job, 0.6, metrics_of(job.task, 0.6))
    assert main([str(sweep)]) == 0 and (sweep / "submission.zip").is_file()
    capsys.readouterr()
    predictions = sweep / jobs[0].name / "predictions"
    if damage == "deleted":
        shutil.rmtree(predictions)
    else:
        (predictions / "SST-2.tsv").write_bytes(b"")
    with pytest.raises(SystemExit):
        main([str(sweep)])
    (err,) = capsys.readouterr().err.strip().splitlines()
    said = "is gone (the job wrote it; it was deleted or moved since)" if damage == "deleted" else "is empty (0 bytes"
    assert err.startswith(f"lightbert: error: no submission.zip for ckpt: {predictions / 'SST-2.tsv'} {said}")
    assert f"Delete {sweep / jobs[0].name} and run the same benchmark command again" in err
    assert err.endswith("(the earlier submission.zip is removed)") and not (sweep / "submission.zip").exists()


def test_squad_table_holds_the_official_scores_of_each_best_job(tmp_path):
    sweep = tmp_path / "sweep"
    jobs = [BenchmarkJob(f"c-squad_v1-s{seed}", "squad", "squad_v1", "c", {}, seed, []) for seed in (1, 2)] + [
        BenchmarkJob("c-squad_v2-s1", "squad", "squad_v2", "c", {}, 1, [])
    ]
    write_plan(sweep, "squad", jobs)
    fake_job(sweep, jobs[0], 88.0, {"exact_match": 80.0, "f1": 88.0})
    fake_job(sweep, jobs[1], 86.0, {"exact_match": 78.0, "f1": 86.0})
    fake_job(sweep, jobs[2], 75.0, {"exact": 72.5, "f1": 75.0, "best_f1": 76.0})
    write_tables(sweep)
    md = (sweep / "squad_table.md").read_text()
    assert "| `c` | 79.0 ± 1.4/87.0 ± 1.4 | 72.5/75.0 | 3/3 |" in md
    assert "| BERT_LARGE (paper Tables 2 and 3, single, dev set) | 84.1/90.9 | 78.7/81.9 |  |" in md


# -- end to end ---------------------------------------------------------------------------------------------------


TINY = ["trainer=cpu", "task.datamodule.num_workers=0", "task.batch_size=8", "trainer.max_epochs=1", "optim.lr=1e-3"]


@pytest.mark.slow
def test_glue_and_squad_benchmarks_end_to_end(tmp_path):
    """The real command on all nine GLUE tasks (16 training rows each, two steps) and both SQuADs: the tables equal
    the jobs' results, the zip holds the server's files, a second run skips every finished job."""
    bert = write_hf_bert(tmp_path / "bert")
    data = tmp_path / "glue"
    for task, splits in GLUE_SPLITS.items():
        for i, split in enumerate(splits):
            labelled = split == "train" or split.startswith("validation")
            write_glue_file(
                data / task / f"{split}.tsv", task, 16 if split == "train" else 8, seed=i, labelled=labelled
            )
    sweep = tmp_path / "glue_sweep"
    command = ["experiment=glue_benchmark", f"init_from={bert}", f"benchmark.data_dir={data}", "benchmark.wnli=true",
               "benchmark.restarts=2", "logger=csv", "task.max_seq_length=32", *TINY,
               f"hydra.sweep.dir={sweep}"]  # fmt: skip
    result = run_train_forked(*command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "lightbert: benchmark in" in result.stdout
        and "13 jobs, 0 finished before (skipped), 13 to run" in result.stdout
    )
    table = json.loads((sweep / "glue_table.json").read_text())
    (row,) = table["rows"]
    assert row["finished"] == row["planned"] == 13
    assert list(row["tasks"]) == ["mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "wnli"]
    columns = {t: m for t, _, m in COLUMNS["glue"]}
    for task, cell in row["tasks"].items():
        assert len(cell["jobs"]) == (2 if task in ("rte", "mrpc", "stsb", "cola") else 1)
        results = [json.loads((sweep / name / "results.json").read_text()) for name in cell["jobs"]]
        for i, metric in enumerate(columns[task]):
            assert cell["metrics"][i]["mean"] == pytest.approx(
                statistics.mean(100 * r["best_metrics"][metric] for r in results)
            )
    # The average, by hand from the jobs' results: MNLI-m and -mm, the mean of F1 and accuracy for QQP and MRPC.
    mean = {t: [m["mean"] for m in c["metrics"]] for t, c in row["tasks"].items()}
    by_hand = [*mean["mnli"], statistics.mean(mean["qqp"]), *(mean[t][0] for t in ("qnli", "sst2", "cola", "stsb"))]
    by_hand += [statistics.mean(mean["mrpc"]), mean["rte"][0]]
    assert row["average"] == pytest.approx(statistics.mean(by_hand))
    with zipfile.ZipFile(sweep / "submission.zip") as archive:
        assert set(archive.namelist()) == SERVER_FILES
        for task, cell in row["tasks"].items():
            for name in TASKS[task].submission_files:
                assert archive.read(name) == (sweep / cell["best_job"] / "predictions" / name).read_bytes()
    assert "lightbert: submission.zip in" in result.stdout

    finished = {p: p.stat().st_mtime_ns for p in sweep.glob("*/results.json")}
    again = run_train_forked(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "13 jobs, 13 finished before (skipped), 0 to run" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in sweep.glob("*/results.json")} == finished

    # SQuAD, with W&B (offline): one run per job, the benchmark one group; a failed job is listed, the other goes on.
    squad = tmp_path / "squad"
    write_official(squad / "squad_v1" / "train.json", squad_articles(4, seed=1))
    write_official(squad / "squad_v1" / "validation.json", squad_articles(2, seed=2))
    repeated = squad_articles(4, seed=1, unanswerable=True) * 2  # question ids repeat: the job is refused
    write_official(squad / "squad_v2" / "train.json", repeated, "2.0")
    write_official(squad / "squad_v2" / "validation.json", squad_articles(2, seed=2, unanswerable=True), "2.0")
    squad_sweep = tmp_path / "squad_sweep"
    command = ["experiment=squad_benchmark", f"init_from={bert}", f"benchmark.data_dir={squad}",
               "task.max_seq_length=64", "task.doc_stride=16", "task.max_query_length=16", *TINY,
               f"hydra.sweep.dir={squad_sweep}"]  # fmt: skip
    result = run_train_forked(*command)
    assert result.returncode == 2 and "question ids must be unique" in result.stderr
    md = (squad_sweep / "squad_table.md").read_text()
    key = checkpoint_key(str(bert))
    v1 = json.loads((squad_sweep / f"{key}-squad_v1-s12345" / "predictions" / "eval.json").read_text())
    assert f"| `{bert}` | {v1['exact_match']:.1f}/{v1['f1']:.1f} | - | 1/2, 1 failed |" in md
    v1_overrides = yaml.safe_load((squad_sweep / f"{key}-squad_v1-s12345" / ".hydra" / "overrides.yaml").read_text())
    groups = [o for o in v1_overrides if o.startswith("logger.wandb.group=")]
    assert groups == [f"logger.wandb.group={tmp_path.name}-squad_sweep"]  # the same for every job
    assert list((squad_sweep / f"{key}-squad_v1-s12345" / "wandb").glob("offline-run-*"))
    write_official(squad / "squad_v2" / "train.json", squad_articles(4, seed=1, unanswerable=True), "2.0")
    result = run_train_forked(*command)  # the failed job again, the finished one skipped
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 jobs, 1 finished before (skipped), 1 to run" in result.stdout
    v2 = json.loads((squad_sweep / f"{key}-squad_v2-s12345" / "predictions" / "eval.json").read_text())
    assert f"| {v2['exact']:.1f}/{v2['f1']:.1f} | 2/2 |" in (squad_sweep / "squad_table.md").read_text()


@pytest.mark.slow
def test_a_benchmark_jobs_ddp_process_runs_that_job_alone(tmp_path):
    """The benchmark is a multirun by its config, not by -m: a job's rank 1 must still run that job, not the sweep."""
    bert = write_hf_bert(tmp_path / "bert")
    for i, split in enumerate(GLUE_SPLITS["rte"]):
        write_glue_file(tmp_path / "glue" / "rte" / f"{split}.tsv", "rte", 16, seed=i, labelled=split != "test")
    sweep = tmp_path / "sweep"
    result = run_train_forked(
        "experiment=glue_benchmark", f"init_from={bert}", f"benchmark.data_dir={tmp_path / 'glue'}",
        "benchmark.tasks=[rte]", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "logger=csv",
        "task.max_seq_length=32", *TINY, f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("lightbert: benchmark in") == result.stdout.count("summary in") == 1
    (job,) = [p for p in sweep.iterdir() if p.is_dir()]
    assert (job / "train_ddp_process_1.log").is_file() and (job / "results.json").is_file()
