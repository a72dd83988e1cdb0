"""ferry's replication service: config, planner, executor, engine, daemon (and the API on top)."""

from __future__ import annotations

from .config import Config, load_config, parse_config
from .daemon import UNCHANGED, Daemon

__all__ = ["Config", "Daemon", "UNCHANGED", "load_config", "parse_config"]
