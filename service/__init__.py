"""ferry's replication service: decide (planner), do (executor, transfer), count (stats), remember
(replication_state), and the daemon and ``ferry sync`` that drive them; the HTTP API is ``ferry.service.api``.

Where things are: ``config`` (ferry.toml, typed), ``planner`` (manifests in, actions out, pure),
``engine`` (one pass: plan → copy → publish → retire), ``executor`` and ``slots`` (a bounded pool of
shard jobs; outcomes from the error tree), ``transfer`` (one shard copy: which path) over
``hashed_io`` (the one read-hash-write loop), ``local_copy``, ``object_store``, ``s3_presigned`` and
``http_pool``; ``replication_state`` (SQLite: every durable fact), ``stats`` (live counters),
``records`` (what the daemon hands out), ``events``, ``lease``, ``bandwidth``, ``daemon``, ``cli``,
and ``noop_check`` over ``s3_get`` (``ferry sync``'s no-op without the storage stack).

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
