"""Every config composes; the headline commands compose as documented; user mistakes get one clear message."""

import pytest
from helpers.runs import CONF_DIR, compose_config, run_train_script
from omegaconf import OmegaConf

from lightbert.cli.checks import check_command_line
from lightbert.errors import UserError
from lightbert.model import BertConfig
from lightbert.model_config import ARCHITECTURE_FIELDS
from lightbert.run.configs import group_options

# Values a config group needs before it resolves (its ??? fields).
REQUIRED = {"corpus/text": ["corpus.paths=[corpus.txt]"], "corpus/hf": ["corpus.name=json"]}


def all_options() -> list[tuple[str, str]]:
    """(group, option) for every selectable config file, nested ones too (task, glue/mrpc)."""
    groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
    return [(group, option) for group in groups for option in group_options(group)]


@pytest.mark.parametrize(("group", "option"), all_options())
def test_every_config_file_composes_and_resolves(group, option, tmp_path):
    overrides = [] if group == "hydra" else [f"{group}={option}"]
    cfg = compose_config(overrides + REQUIRED.get(f"{group}/{option}", []), tmp_path)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["model"]["num_hidden_layers"] > 0
    BertConfig.from_dict(resolved["model"])  # every size file is a valid architecture


def test_every_model_config_has_the_encoders_options_at_berts_defaults(tmp_path):
    # one name per setting: each option of the one encoder is a key of every model= (no `+` on the command line),
    # and a BERT size file leaves them at BertConfig's defaults, the paper's BERT
    defaults = BertConfig()
    for name in group_options("model", CONF_DIR):
        model = compose_config([f"model={name}"], tmp_path).model
        assert set(ARCHITECTURE_FIELDS) <= set(model), name
        if name.startswith("bert_"):
            assert {f: model[f] for f in ARCHITECTURE_FIELDS} == {f: getattr(defaults, f) for f in ARCHITECTURE_FIELDS}
        # each family starts from its own weights: BERT's N(0, 0.02), ModernBERT's truncated per-role normals
        assert model.initializer == ("bert" if name.startswith("bert_") else "modernbert"), name
        assert model.initializer_cutoff_factor == defaults.initializer_cutoff_factor == 2.0, name
    cfg = compose_config(["model=bert_tiny", "model.norm_position=pre", "model.final_norm=true"], tmp_path)
    assert BertConfig.from_dict(OmegaConf.to_container(cfg.model)).norm_position == "pre"


def test_model_sizes_match_their_sources(tmp_path):
    expected = {
        "bert_tiny": (2, 128, 2),
        "bert_mini": (4, 256, 4),
        "bert_small": (4, 512, 8),
        "bert_medium": (8, 512, 8),
        "bert_base": (12, 768, 12),
        "bert_large": (24, 1024, 16),
    }
    for name, (layers, hidden, heads) in expected.items():
        model = compose_config([f"model={name}"], tmp_path).model
        assert (model.num_hidden_layers, model.hidden_size, model.num_attention_heads) == (layers, hidden, heads)
        assert model.intermediate_size == 4 * hidden


def test_headline_command_prints_bert_large_on_ddp8_without_a_gpu():
    result = run_train_script("model=bert_large", "task=pretrain", "trainer=ddp8", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    job = OmegaConf.create(result.stdout)
    assert (job.model.num_hidden_layers, job.model.hidden_size, job.model.num_attention_heads) == (24, 1024, 16)
    assert (job.trainer.strategy, job.trainer.devices, job.trainer.accelerator) == ("ddp", 8, "gpu")


def test_unknown_config_name_lists_the_options():
    result = run_train_script("model=bert_huge", "--cfg", "job")
    assert result.returncode != 0
    assert "bert_huge" in result.stderr and "bert_large" in result.stderr


def test_misspelled_key_names_the_valid_keys():
    with pytest.raises(UserError) as refused:
        check_command_line(["trainer=cpu", "trainer.max_stepz=10"])
    message = str(refused.value)
    assert "trainer.max_stepz" in message and "Did you mean trainer.max_steps?" in message
    assert "val_check_interval" in message  # the valid keys are listed
    check_command_line(["trainer.max_steps=10", "+trainer.new_key=1", "-m", "optim.lr=1e-4,2e-4"])  # all fine


def test_misspelled_key_on_the_command_line_exits_with_the_message():
    result = run_train_script("task.batch_sise=8")
    assert result.returncode == 2
    assert "Did you mean task.batch_size?" in result.stderr
    assert "Traceback" not in result.stderr


def test_shell_completion_installs_and_answers_queries():
    """Hydra's own flags pass the key check: `-sc install=bash` prints the script, a query lists options."""
    installed = run_train_script("-sc", "install=bash")
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert "hydra_bash_completion" in installed.stdout
    query = run_train_script("-sc", "query=bash", COMP_LINE="python src/train.py trainer=dd")
    assert query.returncode == 0, query.stderr[-2000:]
    assert set(query.stdout.split()) == {"trainer=ddp", "trainer=ddp8"}
    # Options in subdirectories are offered, the shared bases (_squad, _glue) are not
    tasks = run_train_script("-sc", "query=bash", COMP_LINE="python src/train.py task=").stdout.split()
    assert "task=glue/mrpc" in tasks and "task=squad_v2" in tasks and not [t for t in tasks if "=_" in t]
    glue = run_train_script("-sc", "query=bash", COMP_LINE="python src/train.py model=bert_tiny task=glue/m")
    assert set(glue.stdout.split()) == {"task=glue/mnli", "task=glue/mrpc"}
    keys = run_train_script("-sc", "query=bash", COMP_LINE="python src/train.py trainer.max_st").stdout.split()
    assert "trainer.max_steps=" in keys  # keys are still Hydra's


def test_help_names_every_option_of_every_group_and_no_private_base():
    result = run_train_script("--help")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    for group in ("model", "task", "corpus", "optim", "trainer", "logger", "cluster", "sweep", "experiment", "debug"):
        start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{group}="))
        text = lines[start].split("=", 1)[1]
        for line in lines[start + 1 :]:  # continuation lines: indented, no group of their own
            if "=" in line or not line.startswith("        "):
                break
            text += " " + line
        listed = text.split("(")[0].replace(",", " ").split()
        assert sorted(listed) == group_options(group, CONF_DIR), group
    assert "_squad" not in result.stdout and "_glue" not in result.stdout and "_default" not in result.stdout


@pytest.mark.parametrize("choice", ["logger=many", "logger=[wandb,tensorboard]"])
def test_several_loggers_at_once(tmp_path, choice):
    assert set(compose_config([choice], tmp_path).logger) == {"csv", "wandb", "tensorboard"}


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("ckpt_path=last.ckpt", "resume=true hydra.run.dir=<run directory> continues a run"),
        ("hparams_search=optuna", "sweep=optuna for a hyper-parameter search"),
        ("logger=null", "logger=null: metrics.csv is always written"),
        ("callbacks=none", "remove one with ~callbacks.<name>"),
    ],
)
def test_another_templates_habit_gets_lightberts_name_for_it(override, said):
    result = run_train_script(override)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("lightbert: error:") and said in result.stderr
