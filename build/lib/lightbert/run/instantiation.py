"""Objects built from config nodes (`hydra.utils.instantiate`), with errors that name the config keys to change."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from lightbert.errors import ParameterError, UserError


def config_keys(node: DictConfig) -> dict[str, str]:
    """Each parameter of a node that builds an object (e.g. `task.datamodule`) -> the key a user sets for it: the
    key it interpolates (`max_seq_length: ${task.max_seq_length}` -> task.max_seq_length), else its own."""
    path = node._get_full_key(None)
    keys = {}
    for name, value in OmegaConf.to_container(node, resolve=False).items():
        match = re.fullmatch(r"\$\{([\w.]+)\}", value) if isinstance(value, str) else None
        keys[str(name)] = match.group(1) if match else f"{path}.{name}"
    return keys


@contextmanager
def parameters_named_by(node: DictConfig) -> Iterator[None]:
    """A `ParameterError` raised while building (or first using) the object of `node` names config keys."""
    try:
        yield
    except ParameterError as error:
        raise error.naming(config_keys(node)) from None


def instantiate_config(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, letting a `UserError` raised by the target through unwrapped, with the config
    keys of the parameters a `ParameterError` names."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, ParameterError) and isinstance(node, DictConfig):
            raise cause.naming(config_keys(node)) from None
        if isinstance(cause, UserError):
            raise cause from None
        raise
    except MissingMandatoryValue as error:
        raise UserError(
            f"{error.full_key} is required: set it on the command line, e.g. {error.full_key}=..."
        ) from None
