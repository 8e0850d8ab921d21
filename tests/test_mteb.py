"""An exported embedding model scored by MTEB with the documented command, `python -m lightbert.interop.mteb_run
<model dir> --tasks ...`, its results saved beside the model; on two small local tasks in MTEB's own formats (this
machine reaches no hub): a retrieval task whose data is a folder laid out as MTEB's hub datasets are (corpus, queries
and qrels configs, loaded by mteb's own RetrievalDatasetLoader) and an STS task (sentence1, sentence2, score).

The references are independent of mteb and of sentence-transformers: lightbert's own embeddings of the run
(`predict_records`) ranked by lightbert's retrieval metric (`tasks.embedding.metrics`), and SciPy's Spearman
correlation of their cosine similarities. Measured: mteb's retrieval scores and Spearman equal them to 5e-6 (mteb
rounds what it saves); checked to 1e-4. The trained model beats the model it started from on both tasks (NDCG@10
0.79 against 0.05, Spearman 0.73 against -0.17).

About 35 CPU-s, most of it importing mteb and training the run (4 epochs of 16 steps)."""

from __future__ import annotations

import contextlib
import io
import json
import random

import pytest
import torch
from helpers.embedding_files import ALIAS, FILLER, TOPICS, WORDS, pair_files, pair_rows
from helpers.models import write_hf_bert
from helpers.runs import compose_config

from lightbert import train
from lightbert.errors import EXTRAS
from lightbert.inference.predict import predict_records
from lightbert.interop import mteb_run
from lightbert.interop.convert import main as convert
from lightbert.tasks.embedding.metrics import positive_ranks, retrieval_scores
from lightbert.tasks.finetuned import load_finetuned

mteb = pytest.importorskip("mteb", reason="the mteb extra: pip install -e '.[mteb]'")
from mteb.abstasks.retrieval import AbsTaskRetrieval  # noqa: E402
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402
from scipy import stats  # noqa: E402 (mteb requires both)
from sentence_transformers import SentenceTransformer  # noqa: E402

# mteb 2.26 calls a method sentence-transformers 6 renamed: nothing lightbert or its user can act on.
pytestmark = pytest.mark.filterwarnings("ignore:The `get_sentence_embedding_dimension` method:FutureWarning")

TRAIN, HELD_OUT = 256, 64  # pair_files' splits: the retrieval task is the held-out split, as the run validated it
RETRIEVAL, STS = "LightbertLocalRetrieval", "LightbertLocalSTS"
METADATA = dict(
    reference=None, category="t2t", modalities=["text"], eval_splits=["test"], eval_langs=["eng-Latn"], date=None,
    domains=None, task_subtypes=None, license=None, annotations_creators=None, dialect=None, sample_creation=None,
    bibtex_citation=None,
)  # fmt: skip


def jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def retrieval_folder(folder, queries: list[str], documents: list[str]):
    """As MTEB's retrieval datasets are on the hub (mteb/scifact, ...): a corpus config (_id, title, text), a queries
    config (_id, text) and the qrels as the default config (query-id, corpus-id, score), named in the README's
    `configs`. Query i's one relevant document is document i."""
    jsonl(folder / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(documents)])
    jsonl(folder / "queries.jsonl", [{"_id": f"q{i}", "text": t} for i, t in enumerate(queries)])
    qrels = [{"query-id": f"q{i}", "corpus-id": f"d{i}", "score": 1} for i in range(len(queries))]
    jsonl(folder / "qrels" / "test.jsonl", qrels)
    configs = {
        "default": ("test", "qrels/test.jsonl"),
        "corpus": ("corpus", "corpus.jsonl"),
        "queries": ("queries", "queries.jsonl"),
    }
    lines = [
        f"- config_name: {name}\n  data_files:\n  - split: {split}\n    path: {path}\n"
        for name, (split, path) in configs.items()
    ]
    (folder / "README.md").write_text("---\nconfigs:\n" + "".join(lines) + "---\n")
    return folder


def sts_rows(anchors: list[str], seed: int = 0) -> list[dict]:
    """Each anchor (three topic words) against four texts in other words: the aliases of k of its topics (k = 0..3)
    and of 3 - k other topics, with filler; the gold score 5k/3. No text shares a word with its anchor."""
    rng = random.Random(seed)
    rows = []
    for anchor in anchors:
        words = anchor.split()
        others = [t for t in TOPICS if t not in words]
        for k in range(4):
            body = [ALIAS[w] for w in words[:k] + rng.sample(others, 3 - k)] + rng.sample(FILLER, 3)
            rng.shuffle(body)
            rows.append({"sentence1": anchor, "sentence2": " ".join(body), "score": 5 * k / 3})
    return rows


def local_tasks(retrieval_dir, sts_dir) -> dict:
    """Fresh task objects (mteb keeps a task's loaded data on it) whose data are the local folders."""

    class LocalRetrieval(AbsTaskRetrieval):
        metadata = TaskMetadata(name=RETRIEVAL, description="held-out pairs", type="Retrieval",
                                dataset={"path": str(retrieval_dir), "revision": "local"}, main_score="ndcg_at_10",
                                **METADATA)  # fmt: skip

    class LocalSTS(AbsTaskSTS):
        min_score, max_score = 0, 5
        metadata = TaskMetadata(name=STS, description="graded pairs", type="STS", main_score="cosine_spearman",
                                dataset={"path": str(sts_dir), "revision": "local"}, **METADATA)  # fmt: skip

    return {RETRIEVAL: LocalRetrieval(), STS: LocalSTS()}


def mteb_command(folders, *argv: str) -> tuple[int, str]:
    """`python -m lightbert.interop.mteb_run ARGV` in this process, the local tasks known by name (the module's
    test hook), datasets' cache in the test's folder: its exit status and stdout."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        for name, task in local_tasks(*folders[:2]).items():
            patch.setitem(mteb_run.LOCAL_TASKS, name, task)
        patch.setattr("datasets.config.HF_DATASETS_CACHE", str(folders[2]))
        code = mteb_run.main(list(argv))
    return code, out.getvalue()


def result_files(model_dir) -> dict:
    """The JSON files the command wrote under `<model dir>/mteb/`, by name (a task's, model_meta)."""
    return {path.stem: path for path in (model_dir / "mteb").rglob("*.json")}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A run trained for 4 epochs, exported with `convert to-hf`, and the model it started from (as
    sentence-transformers loads a transformers directory: mean pooling, the run's; not normalised, which no cosine
    sees), each scored by the command on both tasks."""
    root = tmp_path_factory.mktemp("mteb")
    bert = write_hf_bert(root / "bert", words=WORDS)
    files = pair_files(root / "pairs", train=TRAIN, validation=HELD_OUT)
    overrides = ["task=embedding", "trainer=cpu", "logger=csv", "task.batch_size=16", "task.datamodule.num_workers=0",
                 "trainer.max_epochs=4", "optim.lr=1e-3", f"init_from={bert}",
                 f"task.data_files.train={files['train']}",
                 f"task.data_files.validation={files['validation']}"]  # fmt: skip
    results = train(compose_config(overrides, root / "run"))
    assert convert(["to-hf", str(root / "run"), str(root / "exported")]) == 0
    SentenceTransformer(str(bert), device="cpu").save(str(root / "untrained"))  # a transformers dir: mean pooling

    held_out = {column: values[TRAIN:] for column, values in pair_rows(TRAIN + HELD_OUT, seed=1).items()}
    sts = sts_rows(held_out["anchor"][:16])
    jsonl(root / "sts" / "test.jsonl", sts)
    folders = (retrieval_folder(root / "retrieval", held_out["anchor"], held_out["positive"]), root / "sts",
               root / "datasets-cache")  # fmt: skip
    printed = {}
    for model in ("exported", "untrained"):
        code, printed[model] = mteb_command(folders, str(root / model), "--tasks", RETRIEVAL, STS, "--device", "cpu")
        assert code == 0
    return {"root": root, "results": results, "held_out": held_out, "sts": sts, "folders": folders,
            "printed": printed}  # fmt: skip


def scores(model_dir, task: str) -> dict:
    return json.loads(result_files(model_dir)[task].read_text())["scores"]["test"][0]


def lightbert_embeddings(run_dir, texts: list[str]) -> torch.Tensor:
    model = load_finetuned(str(run_dir))
    predictions = predict_records(model, [(n, {"text": t}) for n, t in enumerate(texts)])[0].predictions
    return torch.tensor([p["embedding"] for p in predictions])


def test_the_results_are_saved_beside_the_model_one_json_file_a_task(scored):
    exported = scored["root"] / "exported"
    files = result_files(exported)
    assert set(files) == {RETRIEVAL, STS, "model_meta"}
    revision = mteb_run.weights_revision(exported, exported / "mteb")
    folder = exported / "mteb" / "results" / "lightbert__exported" / revision
    assert all(file.parent == folder for file in files.values()), files
    for task in (RETRIEVAL, STS):
        result = json.loads(files[task].read_text())
        assert result["task_name"] == task and result["mteb_version"] == mteb.__version__
        assert (
            f"lightbert: {task}: " in scored["printed"]["exported"]
            and str(files[task]) in scored["printed"]["exported"]
        )
    assert json.loads(files["model_meta"].read_text())["name"] == "lightbert/exported"
    # The untrained model's weights differ: its results are its own, under its own revision.
    assert mteb_run.weights_revision(scored["root"] / "untrained", scored["root"] / "untrained" / "mteb") != revision


def test_mtebs_retrieval_scores_are_lightberts_own_on_the_same_queries_and_corpus(scored):
    run_dir = scored["root"] / "run"
    held_out = scored["held_out"]
    queries, documents = (lightbert_embeddings(run_dir, held_out[c]) for c in ("anchor", "positive"))
    ours = retrieval_scores(positive_ranks(queries, documents, torch.arange(len(queries))))
    theirs = scores(scored["root"] / "exported", RETRIEVAL)
    for name, value in ours.items():
        assert theirs[name] == pytest.approx(value, abs=1e-4), name
    assert theirs["main_score"] == theirs["ndcg_at_10"]
    # The run's own validation scored the same split with the checkpoint convert exported (its best).
    assert theirs["ndcg_at_10"] == pytest.approx(scored["results"]["best_metrics"]["val/ndcg_at_10"], abs=1e-4)


def test_mtebs_sts_score_is_scipys_spearman_of_lightberts_cosines(scored):
    rows = scored["sts"]
    first, second = (
        lightbert_embeddings(scored["root"] / "run", [r[c] for r in rows]) for c in ("sentence1", "sentence2")
    )
    cosines = torch.nn.functional.cosine_similarity(first, second).tolist()
    expected = stats.spearmanr([r["score"] for r in rows], cosines).statistic
    theirs = scores(scored["root"] / "exported", STS)
    assert theirs["cosine_spearman"] == pytest.approx(expected, abs=1e-4)
    assert theirs["main_score"] == theirs["cosine_spearman"]


def test_the_trained_model_beats_the_model_it_started_from(scored):
    trained, untrained = (scored["root"] / name for name in ("exported", "untrained"))
    # 64 queries, no word shared with their documents: chance NDCG@10 is about 0.05.
    assert scores(trained, RETRIEVAL)["ndcg_at_10"] > scores(untrained, RETRIEVAL)["ndcg_at_10"] + 0.4
    assert scores(trained, STS)["cosine_spearman"] > scores(untrained, STS)["cosine_spearman"] + 0.3


def test_a_second_run_keeps_the_first_runs_results(scored):
    exported = scored["root"] / "exported"
    before = {name: (file.read_bytes(), file.stat().st_mtime_ns) for name, file in result_files(exported).items()}
    code, printed = mteb_command(scored["folders"], str(exported), "--tasks", RETRIEVAL, STS)
    assert code == 0
    assert printed.count("(kept from an earlier run)") == 2, printed
    assert {
        name: (file.read_bytes(), file.stat().st_mtime_ns) for name, file in result_files(exported).items()
    } == before


def test_another_output_folder_takes_the_results_there(scored, tmp_path):
    exported = scored["root"] / "exported"
    code, printed = mteb_command(
        scored["folders"], str(exported), "--tasks", RETRIEVAL, "--output", str(tmp_path / "out")
    )
    assert code == 0 and "kept" not in printed
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    revision = mteb_run.weights_revision(exported, tmp_path / "out")
    assert [str(p) for p in written] == [
        f"out/results/lightbert__exported/{revision}/{RETRIEVAL}.json",
        f"out/results/lightbert__exported/{revision}/model_meta.json",
    ]


@pytest.mark.parametrize(
    ("model", "tasks", "says"),
    [
        ("missing", [RETRIEVAL], "missing: no such directory"),
        ("bert", [RETRIEVAL], "is not a sentence-transformers model (no modules.json): export a task=embedding run"),
        ("exported", ["NoSuchMTEBTask"], "no such MTEB task: 'NoSuchMTEBTask' not found"),
    ],
)
def test_a_bad_model_dir_or_task_is_one_line(scored, capsys, model, tasks, says):
    with pytest.raises(SystemExit) as stopped:
        mteb_run.main([str(scored["root"] / model), "--tasks", *tasks])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("lightbert: error: ") and says in error and error.count("\n") == 1, error


def test_without_mteb_it_names_the_extra(scored, capsys, monkeypatch):
    monkeypatch.setitem(EXTRAS, "mteb", "lightbert_tests_no_such_module")
    with pytest.raises(SystemExit):
        mteb_run.main([str(scored["root"] / "exported"), "--tasks", RETRIEVAL])
    error = capsys.readouterr().err
    assert "needs lightbert's mteb extra" in error and "pip install -e '.[mteb]'" in error, error
