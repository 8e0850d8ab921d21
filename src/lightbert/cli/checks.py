"""Friendlier command-line errors than Hydra's for the commonest mistakes: a misspelled config key or option.

Hydra rejects a misspelled key (`max_stepz` for `max_steps`) with "Key 'max_stepz' is not in struct". Before
Hydra runs, this composes the config the same way and, for a key that does not exist, names the valid keys at
that level and the closest match. Anything it cannot judge (sweeps, `+`/`~` overrides, hydra.* keys, a config that
does not compose) is left to Hydra.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lightbert.errors import UserError, missing_extra
from lightbert.files import cannot_be_made
from lightbert.run.configs import CONF_DIR, group_options, is_group

# Keys that other templates (lightning-hydra-template) use, and what lightbert calls them.
HABITS = {
    "ckpt_path": "lightbert has two keys for it: resume=true hydra.run.dir=<run directory> continues a run from its "
    "checkpoints/last.ckpt, and init_from=<.ckpt | run directory | Hugging Face dir> starts a new run from its weights",
    "hparams_search": "lightbert's sweeps are sweep=...: sweep=optuna for a hyper-parameter search (with -m); "
    "python src/train.py --help lists the others",
    "logger=null": "metrics.csv is always written; for no other logger, use logger=csv",
    "callbacks": "callbacks is the config's table of callbacks, not an option; remove one with "
    "~callbacks.<name> (e.g. ~callbacks.console_report)",
}


# Options whose Hydra plugin is an extra of lightbert's (pyproject.toml), not a dependency of every install.
OPTION_EXTRAS = {"sweep=optuna": "optuna", "cluster=slurm": "slurm", "cluster=submitit_local": "slurm"}


def unknown_option_message(group: str, option: str, conf_dir: Path = CONF_DIR) -> str | None:
    """None when `group=option` names a config file, else a message listing the group's options."""
    options = group_options(group, conf_dir)
    if option in options or option == "null":
        return None
    close = difflib.get_close_matches(option, options, n=1)
    hint = f" Did you mean {group}={close[0]}?" if close else ""
    return f"unknown {group} '{option}'.{hint}\nValid options of {group}: {', '.join(options)}."


def unknown_key_message(cfg: DictConfig, key: str) -> str | None:
    """None when `key` (dotted) exists in `cfg`, else a message naming the valid keys where it went wrong."""
    node, walked = cfg, []
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return None  # a list index or a leaf: not ours to judge
        valid = sorted(str(k) for k in node)  # iterate, not `in`: a ??? value is "not in" a DictConfig
        if part not in valid:
            where = ".".join(walked) or "the top level"
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f" Did you mean {'.'.join([*walked, close[0]])}?" if close else ""
            return (
                f"unknown config key '{key}': '{part}' is not a key of {where}.{hint}\n"
                f"Valid keys of {where}: {', '.join(valid)}.\nTo add a new key on purpose, write +{key}=..."
            )
        node = node._get_node(part)
        walked.append(part)
    return None


def check_command_line(argv: list[str], conf_dir: Path = CONF_DIR, config_name: str = "train") -> None:
    """Refuses (`UserError`) with a clear message an override that names a config key or a group option that does
    not exist."""
    try:
        from hydra import compose, initialize_config_dir
        from hydra._internal.utils import get_args_parser
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = get_args_parser().parse_args(argv)
        if args.shell_completion or args.help or args.hydra_help or args.info:
            return  # Hydra's own flags: `-sc install=bash` and `-sc query=...` take words that are no overrides
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except BaseException:
        return
    groups, keys = [], []
    for override in overrides:
        key = override.key_or_group
        habit = HABITS.get(key) or (HABITS.get(f"{key}=null") if override.value() in (None, "null", "none") else None)
        if habit and not override.is_delete():
            raise UserError(f"{override.input_line}: {habit}")
        if override.is_add() or override.is_force_add() or override.is_delete() or key.startswith("hydra"):
            continue
        if is_group(key, conf_dir):
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
            for value in values:
                message = unknown_option_message(key, value, conf_dir) if isinstance(value, str) else None
                if message:
                    raise UserError(message)
            for value in values:
                extra = OPTION_EXTRAS.get(f"{key}={value}")
                error = missing_extra(extra, f"{key}={value}") if extra else None
                if error is not None:
                    raise error
            if values and isinstance(values[0], str):
                groups.append(f"{key}={values[0]}")
        else:
            keys.append(key)
    if not keys:
        return
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=groups)
    except BaseException:
        return
    for key in keys:
        message = unknown_key_message(cfg, key)
        if message:
            raise UserError(message)


def check_run_directory(argv: list[str], cwd: Path | None = None) -> None:
    """Refuses (`UserError`) with one message a run directory that cannot be made: Hydra would make it before
    lightbert runs, and fail with a traceback. The directory is `hydra.run.dir` (or `hydra.sweep.dir` with -m) when
    given, else under `paths.log_dir` (default `outputs`)."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return  # --cfg, --help, -sc ...: nothing is written
    values = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith(("+", "~")))
    multirun = "-m" in argv or "--multirun" in argv
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    default_log_dir = str(OmegaConf.load(CONF_DIR / "paths" / "default.yaml").log_dir)
    directory = values.get(key) or values.get("paths.log_dir") or default_log_dir
    if "${" in directory:
        return  # an interpolation: Hydra resolves it
    path = Path(cwd or Path.cwd()) / Path(directory).expanduser()
    problem = cannot_be_made(path)
    if problem is not None:
        given = f"{key}={directory}" if key in values else f"paths.log_dir={directory}"
        raise UserError(f"cannot make the run directory {path} ({given}): {problem}; choose another with {key}=...")
