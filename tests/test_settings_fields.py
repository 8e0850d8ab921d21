"""One home per setting: a setting's kind, range and default live on its typed field (`lightbert.settings_fields`),
and the checks a run makes before anything is written are built from those fields. These tests walk the settings'
fields and the configs a command composes, and fail on a default written twice (a field's and the YAML's) or a range
written outside its field."""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightbert.optim_config import OptimConfig
from lightbert.run.config_checks import NUMBERS, PARTS
from lightbert.run.configs import CONF_DIR
from lightbert.settings_fields import config_key, number_fields, required

SRC = Path(__file__).resolve().parents[1] / "src" / "lightbert"


def composed_configs(tmp_path) -> dict[str, OmegaConf]:
    """Every config a command composes from one choice of the task, trainer and optim groups (the others at their
    defaults): what decides whether a key is always set. An experiment= only adds to these."""
    from helpers.runs import compose_config

    choices = {
        "task": [p.stem for p in (CONF_DIR / "task").glob("[!_]*.yaml")]
        + [f"glue/{p.stem}" for p in (CONF_DIR / "task" / "glue").glob("[!_]*.yaml")],
        "trainer": [p.stem for p in (CONF_DIR / "trainer").glob("[!_]*.yaml")],
        "optim": [p.stem for p in (CONF_DIR / "optim").glob("*.yaml")],
    }
    return {
        f"{group}={option}": compose_config([f"{group}={option}"], tmp_path / "run")
        for group, options in choices.items()
        for option in options
    }


def settings_keys() -> list[tuple[str, object, str]]:
    """(config key, field, where) for every setting whose home is a field: each number of a run's settings, and every
    optimiser setting (`OptimConfig` is built from the whole `optim` node)."""
    keys = []
    for cls, part in PARTS:
        chosen = fields(cls) if cls is OptimConfig else [f for f, _ in number_fields(cls)]
        keys += [(config_key(part, f), f, f"{cls.__name__}.{f.name}") for f in chosen]
    return keys


def test_no_default_is_written_twice_and_no_required_setting_is_left_unset(tmp_path):
    """A field has a default only where some config does not set its key (the YAML's is the only one otherwise), and
    a field without one is set by every config (else that command would be refused)."""
    configs = composed_configs(tmp_path)
    assert len(configs) > 20  # every task, trainer and optimiser
    twice, unset = [], []
    for key, f, where in settings_keys():
        lacking = [name for name, cfg in configs.items() if OmegaConf.select(cfg, key, default=MISSING) is MISSING]
        if not required(f) and not lacking:
            twice.append(f"{where} = {f.default!r}, and every config sets {key}")
        if required(f) and lacking:
            unset.append(f"{where} has no default, and {key} is not set by {lacking[:3]}")
    assert not twice, "a default written twice (drop the field's):\n" + "\n".join(twice)
    assert not unset, "\n".join(unset)


def test_every_checked_number_is_its_fields_rule():
    """The run's table of checks is the fields' rules, and no rule is written anywhere but on a field: every
    `Number(...)` in the package is the `number=` of a `setting(...)`."""
    for cls, part in PARTS:
        for f, number in number_fields(cls):
            assert NUMBERS[config_key(part, f)] is number
    stray = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        in_setting = {
            id(kw.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setting"
            for kw in node.keywords
            if kw.arg == "number"
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Number" and id(node) not in in_setting:
                stray.append(f"{path.relative_to(SRC)}:{node.lineno}")
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "kind" for k in node.keys):
                stray.append(f"{path.relative_to(SRC)}:{node.lineno} (a table of rules)")
    assert not stray, f"a rule written outside a field: {stray}"


def ranges_outside_fields(source: str, number_names: set[str]) -> list[str]:
    """Where code checks one number field against a bound of its own (an `if` that reads just that field, orders it
    against a constant, and raises), or gives it a default of its own (`.get("<field>", <value>)`): each a range or a
    default written outside the field. A rule that relates two fields is code, and is not one of these."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and any(isinstance(n, ast.Raise) for b in node.body for n in ast.walk(b)):
            read = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute) and n.attr in number_names}
            ordered = any(
                isinstance(n, ast.Compare)
                and any(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in n.ops)
                and any(
                    isinstance(c, ast.Constant) and isinstance(c.value, int | float) for c in [n.left, *n.comparators]
                )
                for n in ast.walk(node.test)
            )
            others = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute) and n.attr != "get"} - read
            if len(read) == 1 and ordered and not others - {"self"}:
                found.append(f"line {node.lineno}: a range of {read.pop()}")
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).rsplit(".", 1)[-1] in number_names
            and not (isinstance(node.args[1], ast.Constant) and node.args[1].value is None)
        ):
            found.append(f"line {node.lineno}: a default of {node.args[0].value}")
    return found


@pytest.mark.parametrize(("cls", "part"), PARTS, ids=[part or "run" for _, part in PARTS])
def test_no_range_or_default_is_written_outside_its_field(cls, part):
    source = Path(inspect.getsourcefile(cls)).read_text()
    names = {f.name for f, _ in number_fields(cls)}
    assert not ranges_outside_fields(source, names)


def test_the_walk_finds_a_range_or_a_default_written_outside_its_field():
    """What the test above would have found at 1f43813: OptimConfig's own `warmup_ratio >= 1`, and
    TrainerSettings.from_config's `checked.get("num_nodes", 1)` beside the YAML's."""
    before = textwrap.dedent(
        """
        class OptimConfig:
            def __post_init__(self):
                if self.warmup_ratio >= 1:
                    raise ConfigError("optim.warmup_ratio must be >= 0 and < 1")
                if self.decay_ratio is not None and self.decay_ratio > 1:
                    raise ConfigError("optim.decay_ratio is a share of the steps")
                if self.precision == "bf16-true" and self.accumulate_grad_batches > 1:
                    raise ConfigError("two fields: a rule, not a range")
            def from_config(cls, checked):
                return cls(num_nodes=checked.get("num_nodes", 1), max_epochs=checked.get("max_epochs"))
        """
    )
    names = {"warmup_ratio", "decay_ratio", "accumulate_grad_batches", "num_nodes", "max_epochs"}
    assert ranges_outside_fields(before, names) == [
        "line 4: a range of warmup_ratio",
        "line 6: a range of decay_ratio",
        "line 11: a default of num_nodes",
    ]


def test_optimiser_settings_built_in_code_take_the_yaml_recipe_and_its_checks():
    """`OptimConfig.recipe`: conf/optim/<name>.yaml's values (the only defaults there are), the given ones over them,
    each checked by its field as a run's config is."""
    from lightbert.errors import ConfigError

    stable = OptimConfig.recipe("stableadamw", lr=1e-3, warmup_ratio=0)
    assert (stable.betas, stable.weight_decay, stable.decouple_lr) == ((0.9, 0.98), 1e-5, True)
    assert OptimConfig.recipe("lamb", lr=1, warmup_ratio=0).lr == 1.0  # as its kind
    with pytest.raises(ConfigError, match=r"optim.warmup_ratio must be >= 0 and < 1, got 1"):
        OptimConfig.recipe(lr=1e-3, warmup_ratio=1)
    with pytest.raises(ConfigError, match=r"optim.lr is not set"):
        OptimConfig.recipe(warmup_ratio=0)
    with pytest.raises(ConfigError, match=r"optim.name 'sgd' is not known"):
        OptimConfig.recipe("sgd", lr=1e-3, warmup_ratio=0)
