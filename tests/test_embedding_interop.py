"""sentence-transformers parity for task=embedding: a directory sentence-transformers itself saved gives, through
`src/predict.py`, the vectors its `SentenceTransformer.encode` gives (each pooling, with and without normalisation,
texts cut where it cuts them); an embedding run exported with `convert to-hf` loads in transformers' `AutoModel` and
in `SentenceTransformer` with the same vectors, its pooling and normalisation kept (BERT and ModernBERT); what
lightbert does not run (a Dense module, max pooling) is one line, and nothing is written.

Every comparison is fp32 on CPU, to 1e-5 (measured: a max abs diff of 0.0 in each)."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import runtime
from helpers.embedding_files import WORDS, pair_files
from helpers.models import write_hf_bert, write_hf_modernbert
from helpers.predictions import predict_config
from helpers.runs import REPO, compose_config

from lightbert import train
from lightbert.errors import UserError
from lightbert.inference.predict import predict_records, predict_to_file
from lightbert.interop.convert import main as convert
from lightbert.tasks.finetuned import load_finetuned

st = pytest.importorskip("sentence_transformers")
modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")

ATOL = 1e-5
MAX_SEQ_LENGTH = 16  # tokens, [CLS] and [SEP] included: the longer texts below are cut
TEXTS = [
    "river",
    "the city music album",
    "The River CITY, near the OCEAN!",
    " ".join(WORDS[:12]),
    " ".join(WORDS[5:45]),  # past MAX_SEQ_LENGTH: where each cuts is compared too
    " ".join(reversed(WORDS)),
]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return write_hf_bert(tmp_path_factory.mktemp("bert") / "hf", bare_encoder=True, words=WORDS)


def st_dir(directory, encoder, pooling: str, normalize: bool, *more) -> str:
    """A directory `SentenceTransformer.save` wrote: Transformer -> Pooling(`pooling`) (-> `more`) (-> Normalize)."""
    transformer = modules.Transformer(str(encoder), max_seq_length=MAX_SEQ_LENGTH)
    chain = [transformer, modules.Pooling(transformer.get_embedding_dimension(), pooling), *more]
    st.SentenceTransformer(modules=chain + ([modules.Normalize()] if normalize else []), device="cpu").save(
        str(directory)
    )
    return str(directory)


def encoded(directory) -> np.ndarray:
    """What sentence-transformers gives for TEXTS."""
    return st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS, convert_to_numpy=True)


def predicted(finetuned, max_seq_length: int | None = None) -> np.ndarray:
    """What `src/predict.py`'s function gives for TEXTS (fp32 on CPU)."""
    records = [(n, {"text": text}) for n, text in enumerate(TEXTS, start=1)]
    predicted, _ = predict_records(finetuned, records, batch_size=4, max_seq_length=max_seq_length)
    return np.array([p["embedding"] for p in predicted.predictions])


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a - b).max())


# -- a directory sentence-transformers saved, read by lightbert ---------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "normalize", "ours"), [("mean", True, "mean"), ("cls", False, "cls"), ("lasttoken", False, "last")]
)
def test_predict_gives_sentence_transformers_vectors(bert_dir, tmp_path, mode, normalize, ours):
    directory = st_dir(tmp_path / "st", bert_dir, mode, normalize)
    finetuned = load_finetuned(directory)
    assert (finetuned.head, finetuned.model.pooling, finetuned.model.normalize) == ("embedding", ours, normalize)
    assert finetuned.settings["max_seq_length"] == MAX_SEQ_LENGTH  # where sentence-transformers cuts
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    assert max(len(tokenizer(text)["input_ids"]) for text in TEXTS) > MAX_SEQ_LENGTH + 10
    expected = encoded(directory)
    got = predicted(finetuned)
    assert max_diff(got, expected) < ATOL
    norms = np.linalg.norm(got, axis=1)
    assert np.allclose(norms, 1, atol=1e-5) if normalize else not np.allclose(norms, 1, atol=1e-2)
    # The comparison sees the cut: cut elsewhere, the long texts' vectors differ.
    assert max_diff(predicted(finetuned, MAX_SEQ_LENGTH + 8), expected) > 1e-3


def test_the_predict_command_writes_sentence_transformers_vectors(bert_dir, tmp_path):
    """`python src/predict.py init_from=<sentence-transformers dir>` in a fresh interpreter of a user's install (no
    sentence-transformers there): one {"embedding": [...]} line per input line, as `encode` gives them."""
    directory = st_dir(tmp_path / "st", bert_dir, "mean", True)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    run = subprocess.run(
        [runtime.python(), str(REPO / "src" / "predict.py"), f"init_from={directory}", f"input_file={source}",
         f"output_file={out}"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(line) for line in lines] == [{"embedding"}] * len(TEXTS)
    assert max_diff(np.array([line["embedding"] for line in lines]), encoded(directory)) < ATOL
    assert "were cut to max_seq_length=16 tokens" in run.stderr


# -- an embedding run exported, read by transformers and sentence-transformers -------------------------------------


def pooled(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str, normalize: bool) -> np.ndarray:
    """sentence-transformers' pooling of transformers' `last_hidden_state` (B, T, H), written out here."""
    mask = attention_mask[..., None].float()  # (B, T, 1)
    if pooling == "mean":
        vectors = (hidden * mask).sum(1) / mask.sum(1)
    elif pooling == "cls":
        vectors = hidden[:, 0]
    else:
        vectors = hidden[torch.arange(len(hidden)), attention_mask.sum(1) - 1]
    return (torch.nn.functional.normalize(vectors, dim=-1) if normalize else vectors).numpy()


def trained_embedding_run(tmp_path, init_from, *overrides: str):
    files = pair_files(tmp_path / "data", train=32, validation=16)
    cfg = compose_config(
        ["task=embedding", f"init_from={init_from}", f"task.data_files.train={files['train']}",
         f"task.data_files.validation={files['validation']}", "trainer=cpu", "logger=csv", "trainer.max_steps=2",
         "task.batch_size=8", "optim.lr=1e-3", f"task.max_seq_length={MAX_SEQ_LENGTH}", *overrides],
        tmp_path / "run",
    )  # fmt: skip
    return train(cfg)


def check_export(run_dir, out, pooling: str, normalize: bool, architecture: str) -> dict:
    """`convert to-hf` of an embedding run: transformers' AutoModel (every encoder weight there) pooled as the run
    pools, sentence-transformers' encode and predict.py on the export all give the run's own vectors."""
    assert convert(["to-hf", str(run_dir), str(out)]) == 0
    ours = predicted(load_finetuned(str(run_dir)))
    model, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == architecture
    # A BertModel's tanh pooler, which the embedding model has none of, is all transformers may draw afresh.
    assert not {k for k in info["missing_keys"] if not k.startswith("pooler.")}, info
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    inputs = tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt")
    inputs.pop("token_type_ids", None)
    with torch.no_grad():
        hidden = model.eval()(**inputs).last_hidden_state
    diffs = {
        "transformers": max_diff(pooled(hidden, inputs["attention_mask"], pooling, normalize), ours),
        "sentence-transformers": max_diff(encoded(out), ours),
        "predict on the export": max_diff(predicted(load_finetuned(str(out))), ours),
    }
    assert all(diff < ATOL for diff in diffs.values()), diffs
    exported = load_finetuned(str(out))
    assert (exported.model.pooling, exported.model.normalize) == (pooling, normalize)
    names = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert names == ["Transformer", "Pooling"] + (["Normalize"] if normalize else [])
    return diffs


@pytest.mark.parametrize(
    ("overrides", "pooling", "normalize"),
    [((), "mean", True), (("task.pooling=cls", "task.normalize=false"), "cls", False)],
)
def test_an_exported_embedding_run_gives_its_vectors_in_transformers_and_sentence_transformers(
    bert_dir, tmp_path, overrides, pooling, normalize
):
    results = trained_embedding_run(tmp_path, bert_dir, *overrides)
    assert results["global_step"] == 2
    check_export(tmp_path / "run", tmp_path / "hf", pooling, normalize, "BertModel")


def test_an_exported_modernbert_embedding_run_gives_its_vectors_with_cls_and_sep(tmp_path):
    """A ModernBERT whose tokenizer.json adds no [CLS] and [SEP] itself, as lightbert's own tokenizers are (lightbert
    adds them in its code): the export's tokenizer must add them, or transformers' and sentence-transformers' inputs
    are not the model's (measured before the fix: 0.25 off)."""
    modern = write_hf_modernbert(tmp_path / "modern")
    tokenizer_file = modern / "tokenizer.json"
    tokenizer_file.write_text(json.dumps({**json.loads(tokenizer_file.read_text()), "post_processor": None}))
    trained_embedding_run(tmp_path, modern, "task.pooling=last")
    check_export(tmp_path / "run", tmp_path / "hf", "last", True, "ModernBertModel")
    finetuned = load_finetuned(str(tmp_path / "run"))
    ids = finetuned.tokenizer.encode_batch([TEXTS[1]])[0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer(TEXTS[1])["input_ids"] == [finetuned.tokenizer.cls_id, *ids, finetuned.tokenizer.sep_id]


# -- what lightbert does not run: one line, nothing written ------------------------------------------------------


@pytest.fixture(scope="module")
def unsupported(bert_dir, tmp_path_factory):
    """sentence-transformers directories lightbert refuses, and the word its line must name."""
    tmp = tmp_path_factory.mktemp("unsupported")
    lowercase = Path(st_dir(tmp / "lowercase", bert_dir, "mean", True))
    config = json.loads((lowercase / "sentence_bert_config.json").read_text())
    (lowercase / "sentence_bert_config.json").write_text(json.dumps({**config, "do_lower_case": True}))
    prompt = Path(st_dir(tmp / "prompt", bert_dir, "mean", True))
    config = json.loads((prompt / "config_sentence_transformers.json").read_text())
    prompted = {**config, "prompts": {"query": "query: "}, "default_prompt_name": "query"}
    (prompt / "config_sentence_transformers.json").write_text(json.dumps(prompted))
    return {
        "Dense": st_dir(tmp / "dense", bert_dir, "mean", True, modules.Dense(32, 8)),
        "max": st_dir(tmp / "max", bert_dir, "max", False),
        "do_lower_case": str(lowercase),  # sentence-transformers would change the text before its tokenizer: refused
        "default_prompt_name": str(prompt),
    }


@pytest.mark.parametrize("kind", ["Dense", "max", "do_lower_case", "default_prompt_name"])
def test_predict_refuses_a_module_or_pooling_it_does_not_run_in_one_line(unsupported, tmp_path, kind):
    source, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    source.write_text("the river\n")
    with pytest.raises(UserError) as error:
        predict_to_file(predict_config(unsupported[kind], source, out))
    message = str(error.value)
    assert kind in message and "\n" not in message, message
    assert not out.exists()


@pytest.mark.parametrize("kind", ["Dense", "max"])
def test_embedding_training_refuses_such_an_init_from_in_one_line(unsupported, tmp_path, kind):
    with pytest.raises(UserError) as error:
        trained_embedding_run(tmp_path, unsupported[kind])
    message = str(error.value)
    assert kind in message and "\n" not in message, message
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_convert_refuses_such_a_directory_in_one_line_and_writes_nothing(unsupported, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        convert(["from-hf", unsupported["Dense"], str(tmp_path / "out")])
    lines = capsys.readouterr().err.splitlines()
    assert exit.value.code == 2 and len(lines) == 1 and "a Dense module" in lines[0], lines
    assert not (tmp_path / "out").exists()


# -- a sentence-transformers directory as init_from ----------------------------------------------------------------


def test_init_from_a_sentence_transformers_directory_keeps_its_pooling(bert_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lightbert")
    directory = st_dir(tmp_path / "st", bert_dir, "cls", False)
    results = trained_embedding_run(tmp_path, directory)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task.pooling=")]
    assert said == [f"task.pooling=cls, task.normalize=False: init_from={directory}'s (set them on the command line "
                    "to change)"]  # fmt: skip
    checkpoint = torch.load(results["last_checkpoint"], map_location="cpu", weights_only=True)
    assert (checkpoint["hyper_parameters"]["pooling"], checkpoint["hyper_parameters"]["normalize"]) == ("cls", False)
    finetuned = load_finetuned(str(tmp_path / "run"))
    assert (finetuned.model.pooling, finetuned.model.normalize) == ("cls", False)
    # The command line still decides over init_from.
    caplog.clear()
    trained_embedding_run(tmp_path / "mean", directory, "task.pooling=mean")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task.")]
    assert any(m.startswith(f"task.normalize=False: init_from={directory}'s") for m in said), said
    assert load_finetuned(str(tmp_path / "mean" / "run")).model.pooling == "mean"


def test_evaluate_scores_a_sentence_transformers_directory_as_its_own_vectors_rank_the_pairs(bert_dir, tmp_path):
    """src/evaluate.py on a directory sentence-transformers wrote: its scores are those of sentence-transformers'
    own vectors ranked by hand, with the directory's pooling (cls, not normalised)."""
    from helpers.embedding_files import pair_rows, write_pairs

    from lightbert import evaluate
    from lightbert.tasks.embedding.metrics import positive_ranks, retrieval_scores

    model = st_dir(tmp_path / "st", bert_dir, "cls", False)
    rows = pair_rows(24, seed=5)
    file = write_pairs(tmp_path / "dev.jsonl", rows)
    overrides = ["task=embedding", "trainer=cpu", "logger=csv", f"init_from={model}",
                 f"task.data_files.validation={file}", f"task.max_seq_length={MAX_SEQ_LENGTH}"]  # fmt: skip
    scores = evaluate(compose_config(overrides, tmp_path / "eval", config_name="evaluate"))["metrics"]
    reference = st.SentenceTransformer(model, device="cpu")
    anchors, positives = (
        torch.from_numpy(reference.encode(rows[c], convert_to_numpy=True)) for c in ("anchor", "positive")
    )
    expected = retrieval_scores(positive_ranks(anchors, positives, torch.arange(len(anchors))))
    for name, value in expected.items():
        assert scores[f"val/{name}"] == pytest.approx(value, abs=1e-6), name
