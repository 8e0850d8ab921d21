"""Every config key lightbert names to a user is one the command line accepts.

Two halves: every key spelled out in lightbert's code (error messages, warnings, docstrings) is accepted by
`python src/train.py KEY=... --cfg job` under some task; and every error raised with a class's own parameter
name (`ParameterError`) reaches the user naming the key they set, run for real through `train(cfg)`.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from helpers import runtime
from helpers.runs import CONF_DIR, REPO, compose_config
from omegaconf import OmegaConf

from lightbert import train
from lightbert.checkpoints.hf_format import _MODERNBERT_NAMES
from lightbert.cli.checks import unknown_key_message
from lightbert.data.tokenizer import train_wordpiece
from lightbert.errors import UserError
from lightbert.run.configs import group_options

GROUPS = ("task", "optim", "trainer", "model", "corpus", "logger", "callbacks", "speed", "paths")
# `+logger.wandb.notes=...` adds a key on purpose (the + says so): not matched.
KEY = re.compile(rf"(?<![\w./+-])((?:{'|'.join(GROUPS)})\.[a-z_]\w*(?:\.[a-z_]\w*)*)")


FILE_SUFFIXES = {
    "ckpt",
    "safetensors",
    "json",
    "jsonl",
    "txt",
    "yaml",
    "csv",
    "tsv",
    "parquet",
    "pt",
    "bin",
    "log",
    "md",
    "onnx",
}


ABSENT = object()


# transformers' ModernBERT keeps its encoder's weights under `model.` (model.layers.0.attn.Wo.weight): the strings of
# lightbert's name table and its docstrings that start so are weight names, not the config's model group.
WEIGHT_PREFIXES = tuple({name.split("{")[0] for name, _ in _MODERNBERT_NAMES if name.startswith("model.")})


def keys_named_in_code() -> set[str]:
    """The dotted config keys in every string of lightbert's source (f-strings' literal parts included)."""
    keys = set()
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found = (m for m in KEY.finditer(node.value) if not node.value.startswith(WEIGHT_PREFIXES, m.start()))
                keys.update(k for k in (m.group(1) for m in found) if k.rsplit(".", 1)[1] not in FILE_SUFFIXES)
    return keys


def test_the_scan_finds_keys_it_should():
    keys = keys_named_in_code()
    # a sample of what the messages name, so that a broken pattern cannot pass the test below with nothing
    named = {"trainer.max_steps", "task.data_files", "corpus.paths", "optim.lr", "task.max_query_length"}
    assert named | {"model.embedding_norm"} <= keys


def test_every_key_named_in_code_is_accepted_by_the_command_line():
    keys = keys_named_in_code()
    # A key may belong to one option of a group: task=squad_v1's task.doc_stride, corpus=hf's corpus.config,
    # trainer=fsdp's trainer.strategy.sharding_strategy.
    groups = ("task", "corpus", "logger", "trainer")
    choices = [f"{group}={option}" for group in groups for option in group_options(group, CONF_DIR)]
    configs = {choice: compose_config([choice], REPO / "unused") for choice in choices}
    home: dict[str, list[str]] = {}  # a choice under which each key exists
    for key in sorted(keys):
        # Where the key is in the config, else where the command line would accept it (a value's parent may be a
        # string under one option, e.g. trainer.strategy=auto, and a node under another: trainer=fsdp).
        found = [c for c, cfg in configs.items() if OmegaConf.select(cfg, key, default=ABSENT) is not ABSENT]
        accepted = [c for c, cfg in configs.items() if unknown_key_message(cfg, key) is None]
        choice = next(iter(found or accepted), None)
        assert choice is not None, f"{key} is named in lightbert's code but is no config key under any of {choices}"
        home.setdefault(choice, []).append(key)
    # The real command line, once per choice: all its keys set at once, composed, printed, not run.
    for choice, choice_keys in home.items():
        # A key whose child is set too is checked by the child (setting both to null is no valid override).
        choice_keys = [k for k in choice_keys if not any(other.startswith(k + ".") for other in choice_keys)]
        run = subprocess.run(
            [
                runtime.python(),
                str(REPO / "src" / "train.py"),
                choice,
                *(f"{k}=null" for k in choice_keys),
                "--cfg",
                "job",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, f"{choice} {choice_keys}: {run.stderr}"


@pytest.fixture
def tokenizer_file(tmp_path) -> Path:
    sentences = ["the river is blue", "a city of music", "the team won the game"] * 20
    return train_wordpiece(sentences, vocab_size=60).save(tmp_path / "tokenizer.json")


def finetune(task: str, directory: Path, tokenizer_file: Path, *overrides: str) -> list[str]:
    suffix = {"squad_v1": ".json", "squad_v2": ".json", "conll2003": ".txt"}.get(task, ".csv")
    files = []
    for split in ("train", "validation"):  # never read: the parameters are checked first
        (directory / f"{split}{suffix}").touch()
        files.append(f"task.data_files.{split}={directory / f'{split}{suffix}'}")
    return [f"task={task}", "model=bert_tiny", f"task.datamodule.tokenizer_path={tokenizer_file}", *files, *overrides]


PRETRAIN = ["pretrain", "model=bert_tiny", "corpus=text", "logger=csv"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ([*PRETRAIN, "task.max_seq_length=4"], "task.max_seq_length must be at least 8"),
        ([*PRETRAIN, "task.datamodule.masked_lm_prob=1.5"], "task.datamodule.masked_lm_prob must be in (0, 1)"),
        ([*PRETRAIN, "task.datamodule.validation_fraction=0"], "task.datamodule.validation_fraction must be in"),
        ([*PRETRAIN, "task.datamodule.validation_documents=0"], "task.datamodule.validation_documents must be >= 1"),
        ([*PRETRAIN, "task.datamodule.validation_share=0"], "task.datamodule.validation_share must be > 0"),
        ([*PRETRAIN, "task.datamodule.tokenizer_documents=0"], "task.datamodule.tokenizer_documents must be >= 1"),
        ([*PRETRAIN, "task.datamodule.tokenizer_path=/no/such/tokenizer.json"], "task.datamodule.tokenizer_path: "),
        (["squad_v1", "task.doc_stride=0"], "task.max_query_length (64) and task.doc_stride (0) must be >= 1"),
        (["squad_v2", "task.max_query_length=382"], "task.max_seq_length (384) leaves no room"),
        (["squad_v1", "task.n_best_size=0"], "task.n_best_size (0) and task.max_answer_length (30) must be >= 1"),
        (["conll2003", "task.label_names=[B-PER,B-PER]"], "task.label_names must be distinct tags"),
        (["conll2003", "task.max_seq_length=2"], "task.max_seq_length must be at least 3"),
        (["glue/sst2", "task.max_seq_length=4"], "task.max_seq_length must be at least 8"),
        (["swag", "task.datamodule.max_seq_length=4"], "task.datamodule.max_seq_length must be at least 8"),
    ],
)
def test_parameter_errors_name_the_key_the_user_sets(tmp_path, corpus_file, tokenizer_file, overrides, key):
    if overrides[0] == "pretrain":
        overrides = [*overrides[1:], f"corpus.paths=[{corpus_file}]"]
    else:
        overrides = finetune(overrides[0], tmp_path, tokenizer_file, *overrides[1:])
    with pytest.raises(UserError) as error:
        train(compose_config(overrides, tmp_path / "run"))
    message = str(error.value)
    assert key in message
    named = KEY.findall(message)[0]
    cfg = compose_config([o for o in overrides if o.startswith("task=")], tmp_path / "check")
    assert unknown_key_message(cfg, named) is None, f"{named} is not a key of the config"


def test_a_vocabulary_too_small_names_the_pretraining_key(tmp_path, corpus_file):
    overrides = ["model=bert_tiny", "corpus=text", f"corpus.paths=[{corpus_file}]", "task.datamodule.vocab_size=3"]
    with pytest.raises(UserError, match=re.escape("task.datamodule.vocab_size must exceed the 5 special tokens")):
        train(compose_config([*overrides, "logger=csv"], tmp_path / "run"))


def test_an_option_whose_extra_is_missing_names_the_extra(monkeypatch):
    from lightbert.cli.checks import check_command_line
    from lightbert.errors import EXTRAS, UserError

    monkeypatch.setitem(EXTRAS, "optuna", "lightbert_tests_no_such_module")
    with pytest.raises(UserError) as refused:
        check_command_line(["-m", "task=glue/rte", "sweep=optuna"])
    assert str(refused.value) == (
        "sweep=optuna needs lightbert's optuna extra, which is not installed here: "
        "pip install 'lightbert[optuna]' (in a checkout: pip install -e '.[optuna]')"
    )
    check_command_line(["cluster=slurm"])  # installed here (the dev extra has every extra): no error


def test_the_report_without_matplotlib_names_its_extra(monkeypatch):
    from lightbert.analysis.report import _matplotlib
    from lightbert.errors import EXTRAS, UserError

    monkeypatch.setitem(EXTRAS, "report", "lightbert_tests_no_such_module")
    with pytest.raises(UserError, match=r"needs lightbert's report extra.*pip install 'lightbert\[report\]'"):
        _matplotlib()
