"""Shard tables in the node cache: read from storage once per node, not once per process.

A manifest names its shard table by digest (``tables/<digest>.arrow``, never rewritten), so the node cache keeps it
as ``<cache_dir>/tables/<digest hex>.arrow`` for every process of the node (the ranks of a job, their workers):

- The first process that needs a table holds ``flock`` on ``.locks/<hex>.table`` while it reads the table from
  storage (checked against the manifest's size and digest by the caller's fetch), writes it to a temp name and
  renames it into place. Processes starting at the same time wait on that lock, then read the file: N processes
  starting together cost one read from storage.
- A cached table is checked against the manifest's size and digest every time it is read; one that fails
  (truncated, spoilt, replaced) is fetched again under the lock and replaced.
- Tables count in the cache's ``limit`` (see :meth:`ferry.client.fetching.cache.ShardCache.evict`), which never
  evicts them as shards; the ``KEPT_TABLES`` most recently read ones stay (each read touches its file) and
  older ones are removed after a fill. A process holds its table in memory once read, so removing the file
  breaks nothing: a process waiting for the lock that then finds the file gone fetches it itself.
- When the node cache cannot be used (a read-only or full disk), the table is read from storage as without a
  cache: the dataset is fine, and the shard cache reports this node's disk when it is first written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Mapping
from typing import Any

from ferry.shard_tools.errors import CacheError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import temp_name

from .cache import TABLES, flock_file

__all__ = ["KEPT_TABLES", "cached_table"]

KEPT_TABLES = 4  # tables of this many versions stay in a node cache; a job reads one per dataset
_SUFFIX = ".arrow"


def _hex(table: Mapping[str, Any]) -> str:
    return str(table["digest"]).split(":", 1)[1]


def _good(path: str, table: Mapping[str, Any]) -> bytes | None:
    """The cached table's bytes when they are the manifest's (size and digest), else None."""
    try:
        with open(path, "rb") as f:
            data = f.read(int(table["bytes"]) + 1)
    except OSError:
        return None
    if len(data) != table["bytes"] or digest_bytes(data) != table["digest"]:
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recency: the tables read last are the ones kept
    return data


def cached_table(directory: str, table: Mapping[str, Any], fetch: Callable[[], bytes]) -> bytes:
    """The bytes of the shard table ``table`` (the manifest's ``shard_table``: path, digest, bytes) through the node
    cache at ``directory``: ``fetch()`` (which checks what it reads against the digest) is called by one process
    of the node at a time, and only while no good copy is cached."""
    folder = os.path.join(directory, TABLES)
    path = os.path.join(folder, _hex(table) + _SUFFIX)
    data = _good(path, table)
    if data is not None:
        return data
    with contextlib.ExitStack() as held:
        try:
            os.makedirs(folder, exist_ok=True)
            os.makedirs(os.path.join(directory, ".locks"), exist_ok=True)
            held.enter_context(flock_file(os.path.join(directory, ".locks", f"{_hex(table)}.table"), fcntl.LOCK_EX))
        except (OSError, CacheError):
            return fetch()  # no usable node cache here: read from storage as without one
        data = _good(path, table)  # another process filled it while this one waited
        if data is not None:
            return data
        data = fetch()
        _write(path, data)
    _trim(folder, keep=path)
    return data


def _write(path: str, data: bytes) -> None:
    """Write ``data`` to a temp name beside ``path`` and rename it into place; a failure leaves no file behind
    and no error (the table is in memory: only other processes miss the copy)."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _trim(folder: str, keep: str) -> None:
    """Remove the tables beyond the ``KEPT_TABLES`` most recently read (never ``keep``)."""
    found: list[tuple[float, str]] = []
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        for e in it:
            if e.name.endswith(_SUFFIX) and not e.name.startswith("."):
                with contextlib.suppress(OSError):
                    found.append((e.stat().st_mtime, e.path))
    found.sort(reverse=True)
    for _, path in found[KEPT_TABLES:]:
        if path != keep:
            with contextlib.suppress(OSError):
                os.unlink(path)
