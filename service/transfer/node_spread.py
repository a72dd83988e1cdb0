"""Which Ray node the next copy runs on: the alive node with the fewest copies in flight, taking turns
among equals. Ray's own SPREAD strategy keeps handing new tasks to a worker it already leased, so short
copies all ran on one node; choosing the node here spreads them over every node's network card.

Pure apart from the node lister it is given (the copier passes one that asks Ray).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["NodeSpread"]

#: seconds a list of alive nodes is used before it is asked for again
REFRESH_SECONDS = 10.0


class NodeSpread:
    """Picks a node per copy (:meth:`acquire`) and counts it until :meth:`release`."""

    def __init__(
        self,
        list_nodes: Callable[[], list[str]],
        *,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list_nodes = list_nodes
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: list[str] = []
        self._listed_at: float | None = None
        self._in_flight: dict[str, int] = {}
        self._turn = 0

    def _current_nodes(self) -> list[str]:
        now = self._clock()
        if self._listed_at is None or now - self._listed_at >= self._refresh_seconds:
            self._nodes = sorted(set(self._list_nodes()))
            self._listed_at = now
        return self._nodes

    def acquire(self) -> str | None:
        """The node for the next copy (None when no node is known: the caller leaves the choice to Ray)."""
        with self._lock:
            nodes = self._current_nodes()
            if not nodes:
                return None
            fewest = min(self._in_flight.get(n, 0) for n in nodes)
            equals = [n for n in nodes if self._in_flight.get(n, 0) == fewest]
            node = equals[self._turn % len(equals)]
            self._turn += 1
            self._in_flight[node] = self._in_flight.get(node, 0) + 1
            return node

    def release(self, node: str | None) -> None:
        """The copy started on ``node`` ended (whatever became of it)."""
        if node is None:
            return
        with self._lock:
            left = self._in_flight.get(node, 0) - 1
            if left > 0:
                self._in_flight[node] = left
            else:
                self._in_flight.pop(node, None)

    def forget_listing(self) -> None:
        """Ask for the alive nodes again at the next copy (a task was lost: its node may be gone)."""
        with self._lock:
            self._listed_at = None
