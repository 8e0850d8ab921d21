"""Shell completion: `group=prefix` completed with the group's options, answered before Hydra runs."""

from __future__ import annotations

import sys
from pathlib import Path

from lightbert.run.configs import CONF_DIR, group_options, is_group


def complete_group_option(comp_line: str, conf_dir: Path = CONF_DIR) -> list[str] | None:
    """Shell completion of `group=prefix` with the group's options, nested ones included (`task=glue/mrpc`) and
    shared bases left out (`_squad`), which Hydra's own completion gets wrong; None for anything else (Hydra's)."""
    words = comp_line.split()
    if not words or comp_line.endswith(" ") or "=" not in words[-1]:
        return None
    group, prefix = words[-1].split("=", 1)
    if group.startswith(("+", "~")) or not is_group(group, conf_dir) or "," in prefix:
        return None
    return [f"{group}={option}" for option in group_options(group, conf_dir) if option.startswith(prefix)]


def answer_completion_query(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """`-sc query=bash` (what the installed completion script runs): answer group options here, exit; else return."""
    if not any(a in ("-sc", "--shell-completion") for a in argv) or not any(a.startswith("query=") for a in argv):
        return
    import os

    options = complete_group_option(os.environ.get("COMP_LINE", ""), conf_dir)
    if options is not None:
        print(" ".join(options))
        sys.exit(0)
