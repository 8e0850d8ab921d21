"""Reaching the Hugging Face hub: where its host does not resolve (no network, as on many clusters' compute
nodes), the hub libraries go offline for the rest of the process. Cached models and datasets then load at once, and
anything else fails at once with lightbert's message, instead of after five retries with back-off (23 s of
"Retrying in 8s [Retry 4/5]" lines for a GLUE task on an offline machine)."""

from __future__ import annotations

import logging
import os
import socket
from urllib.parse import urlparse

log = logging.getLogger(__name__)

_checked: bool | None = None  # whether the hub is reachable, once per process


def hub_reachable() -> bool:
    """False (and the hub libraries offline) when HF_HUB_OFFLINE is set or the hub's host does not resolve."""
    global _checked
    if _checked is not None:
        return _checked
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        _checked = False
        return _checked
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
        _checked = True
    except OSError:
        _checked = False
        _go_offline()
        log.info(f"the Hugging Face hub ({host}) cannot be reached from here: using only what is cached")
    return _checked


def _go_offline() -> None:
    # Both libraries read HF_HUB_OFFLINE when imported: the variable for what imports later, the constants for now.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets.config
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    if hasattr(datasets.config, "HF_DATASETS_OFFLINE"):
        datasets.config.HF_DATASETS_OFFLINE = True
