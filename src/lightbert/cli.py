"""Friendlier command-line errors than Hydra's for the commonest mistake: a misspelled config key.

Hydra rejects `trainer.max_stepz=10` with "Key 'max_stepz' is not in struct". Before Hydra runs, this
composes the config the same way and, for a key that does not exist, names the valid keys at that level
and the closest match. Anything it cannot judge (sweeps, `+`/`~` overrides, hydra.* keys, a config that
does not compose) is left to Hydra.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def _is_group(key: str, conf_dir: Path) -> bool:
    return (conf_dir / key.replace(".", "/")).is_dir()


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
    """Exit with a clear message when an override names a config key that does not exist."""
    try:
        from hydra import compose, initialize_config_dir
        from hydra._internal.utils import get_args_parser
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = get_args_parser().parse_args(argv)
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except BaseException:
        return
    groups, keys = [], []
    for override in overrides:
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or override.is_delete() or key.startswith("hydra"):
            continue
        if _is_group(key, conf_dir):
            value = override.value()
            if override.is_sweep_override():
                value = next(iter(override.sweep_string_iterator()), None)
            if isinstance(value, str):
                groups.append(f"{key}={value}")
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
            print(f"lightbert: error: {message}", file=sys.stderr)
            sys.exit(2)
