"""Which shard a swarm fill starts next, and from where (pure: masks in, a choice out; no I/O, no threads).

Every cluster filling a version (the *fillers*) plans alone, from the same facts: the version's rows, the
fillers' names and what each peer says it holds verified and is copying (``swarm_set``). The rows are dealt
to the fillers in turn (row ``r`` is filler ``r % n``'s); a filler pulls its own rows from the origin first,
in order, then, once it has nothing else to do, the rows of the others that no cluster holds or is copying,
from the end of each (their owner works from the start), so the origin sends each shard about once. Rows
some peer holds are pulled from that peer. Each free transfer goes to the least loaded source that has
work for it: the fewest copies in flight per byte/s of its link's limit, peers before the origin on a tie, then by
``priority``;
no source takes more than its share of the transfers, so peers find free ones as they fill.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PeerView", "SwarmPlan", "origin_order"]

#: the capacity taken for a link without a limit when ranking sources by load (bytes/s)
UNLIMITED = 1e15


@dataclass(frozen=True)
class PeerView:
    """What a peer holds of the version: a bool per row verified there, and per row being copied there
    (None: unknown or too old to wait for)."""

    verified: np.ndarray
    in_flight: np.ndarray | None = None


def origin_order(rows: np.ndarray, fillers: Sequence[str], me: str) -> np.ndarray:
    """``rows`` in the order ``me`` pulls them from the origin: its own rows ascending; then, of each other
    filler's rows, those dealt to ``me`` among the rest (every ``n-1``-th), from the end; then every other
    row, from the end."""
    rows = np.asarray(rows, dtype=np.int64)
    n = len(fillers)
    if n <= 1 or me not in fillers:
        return rows.copy()
    k = list(fillers).index(me)
    owner = rows % n
    # among the other fillers of a row's owner, which one steals it first
    helper_pos = (rows // n) % (n - 1)
    helper = np.where(helper_pos >= owner, helper_pos + 1, helper_pos)  # skip the owner itself
    tier = np.where(owner == k, 0, np.where(helper == k, 1, 2))
    key = np.where(tier == 0, rows, -rows)
    return rows[np.lexsort((key, tier))]


class SwarmPlan:
    """One filler's plan over the rows it still has to copy (not thread-safe: its caller locks)."""

    def __init__(
        self,
        rows: np.ndarray,
        shards: int,
        origin: str,
        order: np.ndarray,
        priority: Mapping[str, int] | None = None,
        routes: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """``rows``: the rows to copy; ``shards``: rows in the version; ``order``: ``rows`` in origin
        preference order (:func:`origin_order`); ``priority``: the clusters' ``priority`` (lower first),
        which breaks ties between sources equally loaded; ``routes``: source → the rows planned from it
        (``[swarm] routed``): a row is pulled from its planned source only, unless that source is a peer
        whose set is stale or unknown (then from any holder, or the origin)."""
        self.origin = origin
        self.priority = dict(priority or {})
        self.routes = dict(routes) if routes is not None else None
        self.need = np.zeros(shards, dtype=bool)
        self.need[np.asarray(rows, dtype=np.int64)] = True
        self._remaining = int(self.need.sum())
        self.busy = np.zeros(shards, dtype=bool)  # in flight here
        self._order = np.asarray(order, dtype=np.int64)
        self._peers: dict[str, PeerView] = {}
        self._held = np.zeros(shards, dtype=bool)  # verified at some peer
        self._queues: dict[str, tuple[np.ndarray, list[int]]] = {}  # source → (rows, [cursor])
        self.in_flight: dict[str, int] = {}  # copies running here, by source
        self.update({})

    @property
    def remaining(self) -> int:
        """Rows not yet copied here (those in flight included)."""
        return self._remaining

    def update(self, peers: Mapping[str, PeerView]) -> None:
        """Take the peers' latest sets: rebuild each source's queue of rows."""
        self._peers = dict(peers)
        shards = len(self.need)
        held = np.zeros(shards, dtype=bool)
        copying = np.zeros(shards, dtype=bool)
        for view in self._peers.values():
            held |= view.verified
            if view.in_flight is not None:
                copying |= view.in_flight
        self._held = held
        free = self.need & ~self.busy
        fresh = free & ~held & ~copying
        allowed = self._allowed(shards)
        queues = {self.origin: (self._order[(fresh & allowed(self.origin))[self._order]], [0])}
        for name, view in self._peers.items():
            queues[name] = (np.flatnonzero(free & view.verified & allowed(name)), [0])
        self._queues = queues

    def _allowed(self, shards: int) -> Callable[[str], np.ndarray]:
        """source → the rows it may give: every row without routes; with them, its planned rows and those
        planned from a peer that is not live (no set, or a stale one)."""
        if self.routes is None:
            everything = np.ones(shards, dtype=bool)
            return lambda _source: everything
        orphans = np.zeros(shards, dtype=bool)
        for source, planned in self.routes.items():
            view = self._peers.get(source)
            live = view is not None and (view.in_flight is not None or bool(view.verified.all()))
            if source != self.origin and not live:
                orphans |= planned
        none = np.zeros(shards, dtype=bool)
        routes = self.routes
        return lambda source: routes.get(source, none) | orphans

    def _head(self, source: str) -> int | None:
        """The next row ``source`` can give (skipping rows done or started since the queue was built)."""
        got = self._queues.get(source)
        if got is None:
            return None
        rows, cursor = got
        while cursor[0] < len(rows):
            row = int(rows[cursor[0]])
            if self.need[row] and not self.busy[row]:
                return row
            cursor[0] += 1
        return None

    def next(
        self, capacity: Callable[[str], float | None], per_source: int | None = None
    ) -> tuple[int, tuple[str, ...]] | None:
        """The row to start now and its sources (the chosen one first, then the other holders, the origin
        last), or None: nothing can start until a peer's set or a copy here changes. A source with
        ``per_source`` copies in flight here gets no more (slots stay free for peers as they fill)."""
        best: tuple[tuple[float, bool, int], str, int] | None = None
        for source in self._queues:
            if per_source is not None and self.in_flight.get(source, 0) >= per_source:
                continue
            row = self._head(source)
            if row is None:
                continue
            load = (self.in_flight.get(source, 0) + 1) / (capacity(source) or UNLIMITED)
            key = (load, source == self.origin, self.priority.get(source, 100))
            if best is None or key < best[0]:
                best = (key, source, row)
        if best is None:
            return None
        _, source, row = best
        others = sorted(
            (p for p, v in self._peers.items() if p != source and v.verified[row]),
            key=lambda p: (self.in_flight.get(p, 0) + 1) / (capacity(p) or UNLIMITED),
        )
        sources = tuple(dict.fromkeys([source, *others, self.origin]))
        self.busy[row] = True
        self.in_flight[source] = self.in_flight.get(source, 0) + 1
        return row, sources

    def finished(self, row: int, source: str) -> None:
        """The copy of ``row`` started from ``source`` ended (verified or failed for good: done either way)."""
        self.busy[row] = False
        if self.need[row]:
            self.need[row] = False
            self._remaining -= 1
        self.in_flight[source] = max(0, self.in_flight.get(source, 0) - 1)
