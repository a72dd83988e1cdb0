"""ferry's replication service: config, planner, executor, engine, daemon (and the API on top).

The names below load on first use, so ``ferry sync`` imports only what a pass needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Config", "Daemon", "UNCHANGED", "load_config", "parse_config"]

_LAZY = {
    "Config": "config",
    "load_config": "config",
    "parse_config": "config",
    "Daemon": "daemon",
    "UNCHANGED": "daemon",
}

if TYPE_CHECKING:
    from .config import Config, load_config, parse_config
    from .daemon import UNCHANGED, Daemon


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'service' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
