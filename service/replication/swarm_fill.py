"""A pass's copies as a swarm: each free transfer starts the shard :class:`~.swarm_plan.SwarmPlan` picks, from
the source it picks, while this cluster's own verified set is kept up to date for its peers
(:class:`~.swarm_set.Advertiser`) and theirs are read again every ``[swarm] interval`` seconds.

The executor runs each job as usual (slots, limits, retries, replica fallback, digest check); only the
choice of what to start next, and from where, is made here, at the moment a transfer is free.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ferry.shard_tools.errors import ManifestError, StorageError
from ferry.shard_tools.format.header import MANIFEST_FILE, parse_header
from ferry.shard_tools.storage.store import Location
from ferry.shard_tools.threadname import start_named_thread

from ..config import link_name
from ..config_types import SwarmConfig
from ..transfer.executor import AttemptRecorder, Executor, Job, JobResult
from .swarm_plan import PeerView, SwarmPlan
from .swarm_set import Advertiser, read_swarm

__all__ = ["SwarmFill", "fillers"]


def _publishes(loc: Location, version: str) -> bool:
    try:
        return str(parse_header(loc.read_bytes(MANIFEST_FILE))["version_id"]) == version
    except (FileNotFoundError, StorageError, ManifestError, KeyError):
        return False


def fillers(dest: str, source: str, locations: Mapping[str, Location], version: str) -> list[str]:
    """The clusters that fill ``version`` beside ``dest`` (every cluster of the pass but the source and those
    that publish it already), sorted: every filler computes the same list, so the rows are dealt alike."""
    return sorted(
        c for c in locations if c == dest or (c != source and not _publishes(locations[c], version))
    )  # fmt: skip


@dataclass(frozen=True)
class SwarmFill:
    """The swarm copy of one pass: ``rows`` of the version (``shards`` rows, table ``table_digest``) to
    ``dest``, from ``source`` and the ``peers``; ``static`` holds what other clusters are known to hold
    verified already (published, or recorded by this daemon)."""

    config: SwarmConfig
    executor: Executor
    version: str
    table_digest: str
    shards: int
    source: str
    dest: str
    peers: Sequence[str]
    order: np.ndarray
    static: Mapping[str, np.ndarray]
    priority: Mapping[str, int]
    routes: Mapping[str, np.ndarray] | None = None  # [swarm] routed: source → the rows planned from it

    def _views(self, locations: Mapping[str, Location], patient: bool = True) -> dict[str, PeerView]:
        """Every peer's view; ``patient`` False: what the peers are copying is not waited for. With routes,
        a planned peer that has no set yet counts as live and empty while this filler is patient: it may
        not have started its pass yet."""
        now = time.time()
        views = {name: PeerView(held) for name, held in self.static.items()}
        for name in self.peers:
            got = read_swarm(locations[name], self.version, self.table_digest, self.shards)
            if got is None:
                if name not in views and _publishes(locations[name], self.version):
                    views[name] = PeerView(np.ones(self.shards, dtype=bool))
                elif patient and self.routes is not None and name in self.routes and name not in views:
                    views[name] = PeerView(np.zeros(self.shards, dtype=bool), np.zeros(self.shards, dtype=bool))
                continue
            fresh = patient and now - got.updated_at <= self.config.stale_after
            held = got.verified | views[name].verified if name in views else got.verified
            views[name] = PeerView(held, got.in_flight if fresh else None)
        return views

    def run(
        self,
        rows: np.ndarray,
        advert: Advertiser,
        locations: Mapping[str, Location],
        make_job: Callable[[int, tuple[str, ...]], Job],
        on_result: Callable[[JobResult], None],
        on_attempt: AttemptRecorder,
        stop: Callable[[], bool],
    ) -> None:
        """Copy ``rows`` (blocking): one feeder per transfer slot, the peers' sets read every interval."""
        plan = SwarmPlan(rows, self.shards, self.source, self.order, self.priority, self.routes)
        views = self._views(locations)
        plan.update(views)
        cond = threading.Condition()
        over = threading.Event()
        progress = [time.monotonic()]  # when a copy here (routed: or at a planned peer) last ended
        counts = self._counts(views)

        def capacity(src: str) -> float | None:
            return self.executor.bandwidth.limit_of(link_name(src, self.dest))

        slots = max(1, self.executor.transfers)
        # each source's share of the transfers, rounded up; routed, the plan picked the sources
        share = None if self.routes is not None else -(-slots // (1 + len(self.peers)))

        def feed() -> None:
            while True:
                with cond:
                    got = None
                    while got is None:
                        if stop() or over.is_set() or not plan.remaining:
                            return
                        got = plan.next(capacity, share)
                        if got is None:
                            cond.wait(self.config.interval)
                row, sources = got
                advert.started(row)
                results = self.executor.run([make_job(row, sources)], locations, on_result, on_attempt, stop=stop)
                ok = bool(results) and results[0].ok
                if results and results[0].cancelled:
                    over.set()
                advert.finished(row, ok)
                with cond:
                    plan.finished(row, sources[0])
                    progress[0] = time.monotonic()
                    cond.notify_all()

        feeders = [start_named_thread(feed, f"ferry-swarm-feed-{i}") for i in range(slots)]
        while any(t.is_alive() for t in feeders) and not over.wait(self.config.interval):
            with cond:  # idle here for stale_after, waiting on peers' copies: a peer stuck but alive
                patient = any(plan.in_flight.values()) or time.monotonic() - progress[0] < self.config.stale_after
            views = self._views(locations, patient)
            seen = self._counts(views)
            with cond:
                if seen != counts:  # a planned peer verified more: it is alive and relaying
                    counts, progress[0] = seen, time.monotonic()
                plan.update(views)
                cond.notify_all()
        for t in feeders:
            t.join()

    def _counts(self, views: Mapping[str, PeerView]) -> dict[str, int]:
        """Rows each planned peer holds verified (nothing without routes)."""
        if self.routes is None:
            return {}
        return {name: int(views[name].verified.sum()) for name in self.routes if name in views}
