"""The throughput chart's data: a bounded history of the bytes-copied counter, sampled every second
by a thread of its own, turned into buckets of bytes per second."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ferry.shard_tools.threadname import start_named_thread

__all__ = ["RateHistory", "ThroughputSampler"]


class RateHistory:
    """Samples ``(time, cumulative_bytes)`` for the last ``horizon`` seconds; thread-safe."""

    def __init__(self, horizon: float = 3600.0, min_interval: float = 1.0) -> None:
        self._horizon = horizon
        self._min_interval = min_interval
        self._samples: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def add(self, t: float, total: float) -> None:
        """Record the counter's value at time ``t`` (keeps at most one sample per ``min_interval``)."""
        with self._lock:
            if self._samples and t - self._samples[-1][0] < self._min_interval:
                self._samples[-1] = (self._samples[-1][0], total)
                return
            self._samples.append((t, total))
            while self._samples and self._samples[0][0] < t - self._horizon - self._min_interval:
                self._samples.popleft()

    def buckets(self, now: float, seconds: float, n: int) -> list[tuple[float, float]]:
        """``n`` buckets covering ``(now - seconds, now]``: ``(bucket_end, bytes_per_second)``."""
        n = max(1, n)
        width = seconds / n
        with self._lock:
            samples = list(self._samples)
        out: list[tuple[float, float]] = []
        for i in range(n):
            start = now - seconds + i * width
            end = start + width
            out.append((end, (_value_at(samples, end) - _value_at(samples, start)) / width))
        return out


def _value_at(samples: list[tuple[float, float]], t: float) -> float:
    """Counter value at ``t`` by linear interpolation (flat before the first and after the last sample)."""
    if not samples or t <= samples[0][0]:
        return samples[0][1] if samples else 0.0
    if t >= samples[-1][0]:
        return samples[-1][1]
    lo, hi = 0, len(samples) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if samples[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, v0), (t1, v1) = samples[lo], samples[hi]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


class ThroughputSampler:
    """Samples ``counter()`` (cumulative bytes) into a RateHistory every ``interval`` seconds until closed.

    ``alive()`` says whether a failing read is a stopping daemon (the sampler ends) or a passing fault.
    """

    def __init__(self, counter: Callable[[], float], alive: Callable[[], bool], interval: float = 1.0) -> None:
        self.history = RateHistory(horizon=3600.0, min_interval=interval)
        self._counter = counter
        self._alive = alive
        self._closed = threading.Event()
        self.sample()  # a baseline, so bytes copied before the first tick still show as throughput
        self._thread = start_named_thread(self._run, "ferry-api-rates", (interval,))

    def sample(self) -> None:
        self.history.add(time.time(), float(self._counter()))

    def _run(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.sample()
            except Exception:  # a failing read (daemon stopping) must not kill the sampler
                if not self._alive():
                    return

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
