"""ferry's replication service: config, planner, executor, engine, daemon (and the API on top).

The names below load on first use, so ``ferry sync`` imports only what a pass needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shard_tools.lazy import lazy_attributes

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


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
