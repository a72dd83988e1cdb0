"""Token-bucket bandwidth limits: one global bucket plus one per link, rates changeable at run time."""

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
    """The global bucket and one bucket per link ``"SRC->DST"``."""

    def __init__(self, bwlimit: float | None = None, per_link: Mapping[str, float | None] | None = None) -> None:
        self._lock = threading.Lock()
        self.global_bucket = TokenBucket(bwlimit)
        self._links: dict[str, TokenBucket] = {k: TokenBucket(v) for k, v in (per_link or {}).items()}

    def set_global(self, rate: float | None) -> None:
        self.global_bucket.set_rate(rate)

    def set_link(self, link: str, rate: float | None) -> None:
        with self._lock:
            if link in self._links:
                self._links[link].set_rate(rate)
            else:
                self._links[link] = TokenBucket(rate)

    def link_rates(self) -> dict[str, float | None]:
        with self._lock:
            return {k: b.rate for k, b in self._links.items()}

    def take(self, link: str | None, n: int, cancel: threading.Event | None = None) -> None:
        """Wait until ``n`` bytes may cross ``link`` under both limits."""
        bucket = self._links.get(link) if link else None
        if bucket is not None:
            bucket.take(n, cancel)
        self.global_bucket.take(n, cancel)
