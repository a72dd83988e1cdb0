"""Token-bucket bandwidth limits: one global bucket, one per link and one per node, rates changeable at run time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["TokenBucket", "Bandwidth"]


class TokenBucket:
    """Bytes per second with a burst of about a quarter second; ``rate=None`` means unlimited.

    ``take(n)`` blocks until ``n`` bytes may pass. Large requests are admitted in pieces so
    a chunk bigger than the burst still flows at the configured rate.
    """

    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._rate: float | None = None
        self._tokens = 0.0
        self._stamp = clock()
        self.set_rate(rate)

    @property
    def rate(self) -> float | None:
        return self._rate

    def _burst(self) -> float:
        return max((self._rate or 0.0) / 4, 64 * 1024)

    def set_rate(self, rate: float | None) -> None:
        """Change the rate; takes effect for the next bytes requested (also while others wait)."""
        with self._lock:
            self._refill()
            self._rate = float(rate) if rate else None
            self._tokens = min(self._tokens, self._burst()) if self._rate else 0.0

    def _refill(self) -> None:
        now = self._clock()
        if self._rate:
            self._tokens = min(self._tokens + (now - self._stamp) * self._rate, self._burst())
        self._stamp = now

    def take(self, n: int, cancel: threading.Event | None = None) -> None:
        """Wait until ``n`` bytes may pass (returns early if ``cancel`` is set)."""
        remaining = float(n)
        while remaining > 0:
            with self._lock:
                if not self._rate:
                    return
                self._refill()
                piece = min(remaining, self._burst())
                self._tokens -= piece  # may go negative: the debt is paid by waiting
                remaining -= piece
                wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
            if wait > 0:
                if cancel is not None:
                    if cancel.wait(min(wait, 1.0)) and cancel.is_set():
                        return
                    if wait > 1.0:  # re-evaluate: the rate may have changed meanwhile
                        continue
                else:
                    time.sleep(wait)


class Bandwidth:
    """The global bucket, one bucket per link ``"SRC->DST"`` and one per node (each node's copies
    together: a NIC's share; ``node_rate`` None = no such limit). Rates change at run time; a
    watcher registered with :meth:`watch` hears of every change (the Ray engine's copy of the limits)."""

    def __init__(
        self,
        bwlimit: float | None = None,
        per_link: Mapping[str, float | None] | None = None,
        *,
        node_rate: float | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.global_bucket = TokenBucket(bwlimit)
        self._links: dict[str, TokenBucket] = {k: TokenBucket(v) for k, v in (per_link or {}).items()}
        self._node_rate = float(node_rate) if node_rate else None
        self._nodes: dict[str, TokenBucket] = {}
        self._watchers: list[Callable[[], None]] = []

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after each change of a rate."""
        with self._lock:
            self._watchers.append(callback)

    def _changed(self) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for callback in watchers:
            callback()

    def set_global(self, rate: float | None) -> None:
        self.global_bucket.set_rate(rate)
        self._changed()

    def set_link(self, link: str, rate: float | None) -> None:
        with self._lock:
            if link in self._links:
                self._links[link].set_rate(rate)
            else:
                self._links[link] = TokenBucket(rate)
        self._changed()

    def set_node_rate(self, rate: float | None) -> None:
        """Each node's limit (the same for every node)."""
        with self._lock:
            self._node_rate = float(rate) if rate else None
            for bucket in self._nodes.values():
                bucket.set_rate(self._node_rate)
        self._changed()

    @property
    def node_rate(self) -> float | None:
        return self._node_rate

    def link_rates(self) -> dict[str, float | None]:
        with self._lock:
            return {k: b.rate for k, b in self._links.items()}

    def _node_bucket(self, node: str) -> TokenBucket | None:
        with self._lock:
            if self._node_rate is None:
                return None
            bucket = self._nodes.get(node)
            if bucket is None:
                bucket = self._nodes[node] = TokenBucket(self._node_rate)
            return bucket

    def limit_of(self, link: str | None, node: str | None = None) -> float | None:
        """The tightest rate that applies to bytes crossing ``link`` from ``node`` (None: no limit)."""
        bucket = self._links.get(link) if link else None
        link_rate = bucket.rate if bucket is not None else None
        rates = [self.global_bucket.rate, link_rate, self._node_rate if node else None]
        return min((r for r in rates if r), default=None)

    def take(self, link: str | None, n: int, cancel: threading.Event | None = None, *, node: str | None = None) -> None:
        """Wait until ``n`` bytes may cross ``link`` (copied on ``node``) under every limit."""
        bucket = self._links.get(link) if link else None
        if bucket is not None:
            bucket.take(n, cancel)
        node_bucket = self._node_bucket(node) if node else None
        if node_bucket is not None:
            node_bucket.take(n, cancel)
        self.global_bucket.take(n, cancel)
