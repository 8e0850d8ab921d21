"""Running `src/predict.py`'s function on a finished run's records."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
from hydra import compose, initialize_config_dir

from helpers.runs import CONF_DIR
from lightbert.inference.predict import predict_to_file


def rows(path: Path) -> list[dict]:
    return list(datasets.load_dataset("json", data_files=str(path))["train"])


def predict_config(init_from, input_file, output_file, *extra: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            "predict", [f"init_from={init_from}", f"input_file={input_file}", f"output_file={output_file}", *extra]
        )


def predict(run_dir, records: list[dict], tmp_path: Path, *extra: str) -> list[dict]:
    """predict.py's own function on `records` written as JSON lines; the predictions read back."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.jsonl"
    predict_to_file(predict_config(run_dir, source, out, "overwrite=true", *extra))
    return [json.loads(line) for line in out.read_text().splitlines()]


def records_of(run) -> list[dict]:
    if run.task == "glue/sst2":
        return [{"text": r["sentence"]} for r in rows(run.files["test"])]
    if run.task == "squad_v2":
        return [{"question": r["question"], "context": r["context"]} for r in rows(run.files["validation"])]
    if run.task == "conll2003":
        return [{"words": r["tokens"]} for r in rows(run.files["validation"])]
    return [
        {"context": r["sent1"], "endings": [r[f"ending{i}"] for i in range(4)]} for r in rows(run.files["validation"])
    ]
