"""Live counters of this process (rclone ``accounting`` style): bytes, rates, transfers in flight,
pending work, ETA, failed attempts by kind, other writers seen.

Nothing here outlives the process; durable facts (history, open errors, version timings) are the
State's. Writers are the executor and the engine; readers (API, dashboard, CLI progress bar) call
:meth:`Stats.snapshot`, :meth:`Stats.transfers` and :meth:`Stats.copied_bytes`, which copy under a lock.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, replace

from ..records import ErrorCount, StatsSnapshot, TransferInfo

__all__ = ["Stats"]

_WINDOW = 10.0  # seconds of the moving average (the ETA's rate)
# The current rate: bytes over the last _RATE_WINDOW seconds, divided by that window, or by the time
# since copying resumed when shorter (never less than _RATE_MIN_SPAN: a bandwidth limit's burst at
# the start of a sync would otherwise read as a spike). It decays to 0 within _RATE_WINDOW of the
# last byte; under a limit it reads the limit, within a burst spread over _RATE_MIN_SPAN.
_RATE_WINDOW = 4.0
_RATE_MIN_SPAN = 2.0


@dataclass
class _Live:
    """A copy in flight: its record as it started, and the bytes done since."""

    started: TransferInfo
    started_mono: float
    done: int = 0


class Stats:
    """Counters shared by every transfer of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._next_id = 0
        self._live: dict[int, _Live] = {}
        self._samples: deque[tuple[float, int]] = deque()  # (monotonic time, bytes) per progress call
        self._active_since = 0.0  # when bytes began to flow again after _RATE_WINDOW without any
        self.bytes_copied = 0
        self.bytes_read = 0
        self.transfers_ok = 0
        self.transfers_failed = 0
        self.corrupt_detected = 0
        self._pending: dict[tuple[str, str], tuple[int, int]] = {}
        self._copied: Counter[tuple[str, str, str]] = Counter()  # (dataset, source, destination) → bytes
        self._errors: Counter[tuple[str, str, str]] = Counter()
        self._writers: dict[tuple[str, str], str] = {}  # (dataset, dest) → another writer holding its lease

    # writers
    def set_writer(self, dataset: str, dest: str, holder: str | None) -> None:
        """Note the other writer holding ``dest``'s lease of ``dataset`` (None: none seen any more)."""
        with self._lock:
            if holder is None:
                self._writers.pop((dataset, dest), None)
            else:
                self._writers[(dataset, dest)] = holder

    def other_writers(self) -> dict[tuple[str, str], str]:
        """(dataset, destination) → the other writer whose lease kept this service out, last pass."""
        with self._lock:
            return dict(self._writers)

    def start(self, dataset: str, version: str, shard: str, src: str, dst: str, total: int) -> int:
        with self._lock:
            self._next_id += 1
            tid = self._next_id
            record = TransferInfo(tid, dataset, version, shard, src, dst, 0, total, 0.0, 0.0, time.time())
            self._live[tid] = _Live(record, time.monotonic())
            return tid

    def progress(self, tid: int, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            live = self._live.get(tid)
            if live is not None:
                live.done += n
            self.bytes_read += n
            if not self._samples or now - self._samples[-1][0] > _RATE_WINDOW:
                self._active_since = now
            self._samples.append((now, n))
            while self._samples and self._samples[0][0] < now - _WINDOW:
                self._samples.popleft()

    def finish(self, tid: int, *, ok: bool, nbytes: int = 0) -> None:
        with self._lock:
            live = self._live.pop(tid, None)
            if ok:
                self.transfers_ok += 1
                self.bytes_copied += nbytes
                if live is not None:
                    t = live.started
                    self._copied[(t.dataset, t.source, t.destination)] += nbytes
            else:
                self.transfers_failed += 1

    def corrupt(self, dataset: str, cluster: str) -> None:
        with self._lock:
            self.corrupt_detected += 1
            self._errors[(dataset, cluster, "corrupt")] += 1

    def error(self, dataset: str, cluster: str, *, retryable: bool) -> None:
        with self._lock:
            self._errors[(dataset, cluster, "retryable" if retryable else "fatal")] += 1

    def set_pending(self, dataset: str, dst: str, nbytes: int, shards: int) -> None:
        with self._lock:
            self._pending[(dataset, dst)] = (nbytes, shards)

    def add_pending(self, dataset: str, dst: str, nbytes: int, shards: int) -> None:
        with self._lock:
            b, s = self._pending.get((dataset, dst), (0, 0))
            self._pending[(dataset, dst)] = (max(0, b + nbytes), max(0, s + shards))

    # readers
    def _rates(self, now: float) -> tuple[float, float]:
        recent = sum(n for t, n in self._samples if t > now - _RATE_WINDOW)
        span = min(_RATE_WINDOW, max(now - self._active_since, _RATE_MIN_SPAN))
        window = min(_WINDOW, max(now - self._t0, 1e-3))
        total = sum(n for t, n in self._samples if t >= now - window)
        return recent / span, total / window

    def transfers(self) -> list[TransferInfo]:
        now = time.monotonic()
        with self._lock:
            return [
                replace(
                    t.started,
                    bytes_done=t.done,
                    percent=round(100.0 * min(t.done, t.started.bytes_total) / t.started.bytes_total, 2)
                    if t.started.bytes_total > 0
                    else 0.0,
                    rate_bps=t.done / max(now - t.started_mono, 1e-3),
                )
                for t in self._live.values()
            ]

    def copied_bytes(self) -> dict[tuple[str, str, str], int]:
        """Verified bytes copied since start, keyed (dataset, source, destination)."""
        with self._lock:
            return dict(self._copied)

    def snapshot(self) -> StatsSnapshot:
        now = time.monotonic()
        with self._lock:
            instant, avg = self._rates(now)
            pending_bytes = sum(b for b, _ in self._pending.values())
            pending_shards = sum(s for _, s in self._pending.values())
            in_flight_left = sum(max(0, t.started.bytes_total - t.done) for t in self._live.values())
            eta = None
            if pending_bytes and avg > 0:
                eta = max(pending_bytes, in_flight_left) / avg
            return StatsSnapshot(
                copied_bytes_total=self.bytes_copied,
                bytes_read=self.bytes_read,
                transfers_ok=self.transfers_ok,
                transfers_failed=self.transfers_failed,
                corrupt_detected=self.corrupt_detected,
                rate_bps=instant,
                rate_avg=avg,
                pending_bytes=pending_bytes,
                pending_shards=pending_shards,
                eta_seconds=eta,
                transfers_in_flight=len(self._live),
                uptime_seconds=now - self._t0,
                errors=[ErrorCount(d, c, k, n) for (d, c, k), n in sorted(self._errors.items())],
            )
