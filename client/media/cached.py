"""The node's disk cache for a media dataset read from remote replicas (``MediaDataset(cache_dir=…)``).

The shard files are :class:`ferry.client.fetching.cache.ShardCache`'s (decompressed, checked against the
manifest, shared by every process of the node, evicted least recently used within the limit). A shard read by
frames is brought into the cache whole by a background thread of the reading process; once it is there, its
metadata, tokens and media are read from the mapped file, so a later epoch, a restarted job, or another
DataLoader worker reads it from disk, not from the replicas. A shard of stored format 1 or 2 (read whole anyway)
is opened through the cache at once.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict

from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.shard import ShardView

from ..fetching.cache import Lease, ShardCache

__all__ = ["CachedShards"]

_LEASES_KEPT = 64  # mapped shards held per process (mapped: they cost address space, not memory)
_RETRY = 0.05  # seconds without a new shard asked for before one being filled elsewhere is waited for


class CachedShards:
    """Shards of one dataset in the node's disk cache (see the module docstring); one per process, safe to share
    between its threads."""

    def __init__(self, cache: ShardCache) -> None:
        self.cache = cache
        self._lock = threading.Lock()  # the leases (the metadata threads of a first load open shards at once)
        self._leases: OrderedDict[str, Lease] = OrderedDict()
        self._asked: set[str] = set()
        self._todo: queue.Queue[ShardInfo | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def view(self, info: ShardInfo) -> ShardView | None:
        """The shard mapped from the cache, if it is there (checked against its digest once per process)."""
        with self._lock:
            lease = self._leases.get(info.path)
            if lease is not None:
                self._leases.move_to_end(info.path)
                return lease.view
        if not self.cache.present(info):
            return None
        return self.open(info)

    def open(self, info: ShardInfo) -> ShardView:
        """The shard mapped from the cache, fetched into it first if need be."""
        with self._lock:
            lease = self._leases.get(info.path)
        if lease is None:
            new = self.cache.open(info)  # outside the lock: it may download the shard
            with self._lock:
                lease = self._leases.setdefault(info.path, new)
                if lease is not new:
                    new.release()  # another thread opened it meanwhile
                while len(self._leases) > _LEASES_KEPT:
                    self._leases.popitem(last=False)[1].release()
        with self._lock:
            if info.path in self._leases:
                self._leases.move_to_end(info.path)
        return lease.view

    def fill(self, info: ShardInfo) -> None:
        """Bring the shard into the cache in the background (once per process)."""
        if info.path in self._asked:
            return
        self._asked.add(info.path)
        self._todo.put(info)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ferry-media-cache", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """Fill the shards asked for in turn; one another process is filling waits until nothing else is asked
        (it is most likely whole by then), so the node's processes fill different shards at once."""
        others: list[ShardInfo] = []
        while True:
            try:
                info = self._todo.get(timeout=_RETRY if others else None)
            except queue.Empty:
                self.cache.ensure_in_background(others.pop(0))  # waits for the other process's fill
                self._todo.task_done()
                continue
            if info is None:
                return
            if self.cache.ensure_in_background(info, wait=False):  # a replica's failure shows when it is read
                self._todo.task_done()
            else:
                others.append(info)  # done once waited for

    def settle(self) -> None:
        """Wait for the background fills asked so far; raise a failure of the cache itself (a full disk)."""
        if self._thread is not None:
            self._todo.join()
        self.cache.raise_deferred()

    def close(self) -> None:
        if self._thread is not None:
            self._todo.put(None)
            self._thread = None
        with self._lock:
            while self._leases:
                self._leases.popitem()[1].release()
