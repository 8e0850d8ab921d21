"""Errors a user can cause and fix: a missing file, a bad column, a bad size.

Raising `UserError` means "print this one message and stop": the entry point shows it without a
traceback. Anything else is a bug in lightbert and keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class UserError(Exception):
    """A mistake in the user's input or config, with a message that says what to do."""


class ConfigError(UserError, ValueError):
    """A config value that can't work, e.g. a hidden size not divisible by the number of heads."""


# pyproject.toml's extras: what only one option needs, and the module that shows it is installed.
EXTRAS = {
    "optuna": "hydra_plugins.hydra_optuna_sweeper",  # sweep=optuna
    "slurm": "hydra_plugins.hydra_submitit_launcher",  # cluster=slurm, cluster=submitit_local
    "report": "matplotlib",  # python -m lightbert.analysis.report, paper_tables' figure 5
    "fp8": "torchao",  # speed.fp8=true
    "mteb": "mteb",  # python -m lightbert.interop.mteb_run
}


def require_extra(extra: str, what: str) -> None:
    """Raises `missing_extra`'s error when `what` needs an extra that is not installed."""
    error = missing_extra(extra, what)
    if error is not None:
        raise error


def missing_extra(extra: str, what: str) -> UserError | None:
    """The error for `what` (an option, a command) when the extra it needs is not installed, else None."""
    import importlib.util

    module = EXTRAS[extra]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a namespace parent (hydra_plugins) that is missing too
        found = False
    if found:
        return None
    return UserError(
        f"{what} needs lightbert's {extra} extra, which is not installed here: pip install 'lightbert[{extra}]' "
        f"(in a checkout: pip install -e '.[{extra}]')"
    )


class ParameterError(ConfigError):
    """A bad value of a class's own parameter, e.g. `max_seq_length`. The message names parameters through
    `{0}`, `{1}`, ...: where the class was built from the config, the builder (`run.building.named`) names the config
    keys the user sets instead (`task.max_seq_length`), so the message names keys the command line accepts."""

    def __init__(self, template: str, *parameters: str):
        self.template, self.parameters = template, parameters
        try:
            message = template.format(*parameters)
        except (IndexError, KeyError, ValueError):  # made again from its message (torch's worker, a pickle): as it is
            message = template
        super().__init__(message)

    @classmethod
    def about(cls, parameter: str, error: Exception) -> ParameterError:
        """`error`'s message, said of `parameter` (e.g. a tokenizer file that does not exist)."""
        return cls("{0}: " + str(error).replace("{", "{{").replace("}", "}}"), parameter)


def message_of(error: BaseException) -> str:
    """`error`'s message. A `UserError` raised in a DataLoader worker reaches the main process as torch re-raises it
    (`torch._utils.ExceptionWrapper.reraise`): of the same class, made from "Caught UserError in DataLoader worker
    process 0.\nOriginal Traceback (most recent call last): ..." and the worker's formatted traceback, the only thing
    the worker sends; the message is what that traceback's last exception line says after the class's name."""
    text = str(error)
    if not text.startswith("Caught ") or "\nOriginal Traceback" not in text:
        return text
    kind = type(error)
    name = kind.__qualname__
    if kind.__module__ not in ("__main__", "builtins"):  # as traceback.format_exception names it
        name = f"{kind.__module__}.{name}"
    at = text.rfind(f"\n{name}: ")
    return text[at + len(name) + 3 :].rstrip("\n") if at >= 0 else text


def exits_on_user_error(
    main: Callable[..., T], on_refusal: Callable[[UserError], bool] | None = None
) -> Callable[..., T]:
    """Every entry point's rule, in one place: a `UserError` ends the command with one line on stderr and exit 2,
    without a traceback. `on_refusal` may take the error over instead (a multirun job records it and the sweep goes
    on): it returns True when it did."""

    @functools.wraps(main)
    def entry(*args: Any, **kwargs: Any) -> T:
        try:
            return main(*args, **kwargs)
        except UserError as error:
            if on_refusal is not None and on_refusal(error):
                return None  # type: ignore[return-value]
            print(f"lightbert: error: {message_of(error)}", file=sys.stderr)
            sys.exit(2)

    return entry
