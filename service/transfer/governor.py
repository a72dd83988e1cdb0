"""The Ray engine's one place of shared copy state: the bandwidth limits every task draws from, the
cancel flag, and the bytes each transfer moved. It runs as one threaded Ray actor beside the daemon
(:mod:`.ray_copier`); tasks ask it for bytes (:meth:`Governor.grant`) and report what passed.

A plain class, so it is also used (and tested) without Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from .bandwidth import Bandwidth

__all__ = ["Governor", "Rates", "UNLIMITED_GRANT"]

#: bytes granted at once where no limit applies (a task asks again after PROGRESS_SECONDS regardless)
UNLIMITED_GRANT = 1 << 40
#: under a limit a grant is this many seconds of the tightest rate (at least what was asked, at most
#: MAX_GRANT): few calls per second per task whatever the rate, yet a change of rate or a cancel is
#: heard within about that time
GRANT_SECONDS = 0.1
MAX_GRANT = 16 * 1024 * 1024

#: (global bytes/s, per link bytes/s, per node bytes/s); None = unlimited
Rates = tuple[float | None, Mapping[str, float | None], float | None]


class Governor:
    """Limits, cancel flag and progress for the copies of one executor, whichever node they run on."""

    def __init__(self, rates: Rates) -> None:
        self._bandwidth = Bandwidth()
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._moved: dict[str, int] = {}
        self._nodes: dict[str, set[str]] = {}  # node → transfers that drew bytes there
        self.set_rates(rates)

    def set_rates(self, rates: Rates) -> None:
        bwlimit, per_link, node_rate = rates
        self._bandwidth.set_global(bwlimit)
        for link, rate in per_link.items():
            self._bandwidth.set_link(link, rate)
        self._bandwidth.set_node_rate(node_rate)

    def rates(self) -> Rates:
        return self._bandwidth.global_bucket.rate, self._bandwidth.link_rates(), self._bandwidth.node_rate

    def cancel(self) -> None:
        """Every copy stops at its next grant or report (Cancelled); nothing new is granted."""
        self._cancel.set()

    def grant(self, key: str, link: str, node: str, want: int, moved: int) -> tuple[int, bool]:
        """Note ``moved`` more bytes of transfer ``key``, then wait until at least ``want`` bytes may cross
        ``link`` from ``node``: (bytes granted, cancelled). Where no limit applies the grant is UNLIMITED_GRANT;
        under one it is GRANT_SECONDS of the tightest rate (or ``want`` where that is more)."""
        with self._lock:
            self._nodes.setdefault(node, set()).add(key)
        if self.report(key, moved):
            return 0, True
        rate = self._bandwidth.limit_of(link, node)
        if rate is None:
            return UNLIMITED_GRANT, False
        size = max(want, min(MAX_GRANT, int(rate * GRANT_SECONDS)))
        self._bandwidth.take(link, size, self._cancel, node=node)
        return size, self._cancel.is_set()

    def report(self, key: str, moved: int) -> bool:
        """Note ``moved`` more bytes of transfer ``key``; True once cancelled."""
        if moved:
            with self._lock:
                self._moved[key] = self._moved.get(key, 0) + moved
        return self._cancel.is_set()

    def moved(self, key: str) -> int:
        """Bytes transfer ``key`` moved so far (over all its attempts)."""
        with self._lock:
            return self._moved.get(key, 0)

    def transfers_by_node(self) -> dict[str, int]:
        """How many transfers moved bytes on each node (a task retried elsewhere counts on both)."""
        with self._lock:
            return {node: len(keys) for node, keys in self._nodes.items()}

    def forget(self, key: str) -> None:
        with self._lock:
            self._moved.pop(key, None)
