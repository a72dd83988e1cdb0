"""ferry's replication service: ``replication/`` decides and remembers, ``transfer/`` copies and counts,
and the daemon and ``ferry sync`` drive them; the HTTP API is ``ferry.service.api``.

Where things are: ``config`` (ferry.toml, typed), ``records`` (what the daemon hands out), ``events``,
``names`` (the dataset name rule), ``daemon``, ``cli`` (``ferry sync`` / ``ferry serve``) and ``lease_cli``
at the top; ``replication`` (planner, engine, passes, state, lease, noop_check); ``transfer`` (executor,
slots, copier, ray_copier, ray_tasks, governor, transfer, hashed_io, local_copy, object_store, s3_presigned,
http_pool, bandwidth, stats).
``transfer`` never imports ``replication``, and neither imports ``api``.

The names below load on first use, so ``ferry sync`` imports only what a pass needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry.shard_tools.lazy import lazy_attributes

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
