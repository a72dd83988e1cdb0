"""A bounded pool of shard transfers with retries, replica fallback, pause and graceful stop.

The executor decides nothing: it runs the jobs the planner produced. Each job tries its
sources in order (nearest first); a digest mismatch, a truncated read or a backend error
moves on to the next source, and after a round over all sources it backs off
exponentially with jitter. A job that runs out of attempts fails alone; the others go on.
Where a copy runs is its :class:`~.copier.Copier`'s business: in the worker thread (the default) or
as a Ray task on a cluster's nodes; everything else (slots, retries, statistics, events) stays here.
"""

from __future__ import annotations

import enum
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ferry.shard_tools.errors import (
    Cancelled,
    FerryError,
    ShardDigestError,
    ShardFormatError,
    SourceMissing,
    StorageError,
    WriteConflictError,
)
from ferry.shard_tools.storage.store import Location, not_permitted
from ferry.shard_tools.threadname import start_named_thread

from ..config import link_name
from ..events import EventBus
from .bandwidth import Bandwidth
from .copier import Copier, ThreadCopier
from .hashed_io import CHUNK_SIZE
from .slots import Slots
from .stats import Stats

__all__ = ["ShardRef", "Job", "JobResult", "Executor", "Outcome", "outcome_of"]

_PROGRESS_EVERY = 0.25  # seconds between progress events per transfer


class Outcome(enum.Enum):
    """What one attempt from one source came to, and so what the job does next."""

    OK = "ok"  # the shard is at the destination, verified
    RETRY = "retry"  # try again (another source now, this one after a back-off)
    FATAL = "fatal"  # this source cannot serve the shard: do not ask it again
    REFUSED = "refused"  # the destination holds other bytes at the shard's name: no source can help
    CANCELLED = "cancelled"  # the daemon is stopping


def outcome_of(exc: FerryError) -> Outcome:
    """The decision an error implies, from the error tree alone (``FerryError.retryable``)."""
    if isinstance(exc, Cancelled):
        return Outcome.CANCELLED
    if isinstance(exc, WriteConflictError):
        return Outcome.REFUSED
    if exc.retryable and not not_permitted(exc):  # e.g. a store's own mapping of a 403
        return Outcome.RETRY
    return Outcome.FATAL


@dataclass(frozen=True)
class ShardRef:
    """One shard to copy or plan: its path, stored size and stored digest."""

    path: str
    size: int
    digest: str


@dataclass(frozen=True)
class Job:
    """Bring ``shard`` to ``dest`` (a cluster name), pulling from ``sources`` in order."""

    dataset: str
    version: str
    shard: ShardRef
    sources: tuple[str, ...]
    dest: str
    verify_first: bool = False  # the destination has it with the right size: hash before copying
    # a repair: the destination's current version names this shard with this digest, so a copy may replace
    # the (damaged) object at its name; otherwise a copy only creates the object, never replaces one
    replace: bool = False


#: receives each copy attempt: (job, source, bytes, started (Unix time), duration (s), error or None)
AttemptRecorder = Callable[[Job, str, int, float, float, "str | None"], None]


@dataclass
class JobResult:
    job: Job
    ok: bool
    src: str | None = None
    copied: bool = False  # False when the copy already present verified
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    retryable: bool = True
    attempts: int = 0
    corrupt: int = 0  # corrupt transfers (or a corrupt destination copy) detected on the way
    cancelled: bool = False


class Executor:
    """Runs jobs ``transfers`` at a time under the bandwidth limits."""

    def __init__(
        self,
        *,
        transfers: int = 4,
        bandwidth: Bandwidth | None = None,
        stats: Stats | None = None,
        events: EventBus | None = None,
        retries: int = 5,
        chunk_size: int = CHUNK_SIZE,
        backoff: tuple[float, float] = (0.2, 10.0),
        max_workers: int = 64,
        copier: Copier | None = None,
    ) -> None:
        """``copier`` runs each copy (default: a :class:`~.copier.ThreadCopier` under ``bandwidth``)."""
        self.bandwidth = bandwidth or Bandwidth()
        self.copier: Copier = copier or ThreadCopier(self.bandwidth, chunk_size)
        self.stats = stats or Stats()
        self.events = events
        self.retries = retries
        self.chunk_size = chunk_size
        self.backoff = backoff
        self.max_workers = max_workers
        self._slots = Slots(transfers)
        self.cancel = threading.Event()
        self._rng = random.Random()

    @property
    def transfers(self) -> int:
        return self._slots.size

    def set_transfers(self, n: int) -> None:
        self._slots.resize(max(1, int(n)))

    def pause(self) -> None:
        self._slots.set_paused(True)

    def resume(self) -> None:
        self._slots.set_paused(False)

    @property
    def stopping(self) -> bool:
        """True once ``shutdown`` began: no job starts any more."""
        return self._slots.closed

    @property
    def paused(self) -> bool:
        """Whether new transfers wait for ``resume()`` (the one place pause state is kept)."""
        return self._slots.paused

    def shutdown(self, drain_timeout: float | None = 30.0) -> None:
        """Start nothing new; let transfers in flight finish (up to ``drain_timeout``), then cancel them."""
        self._slots.close()
        if not self._slots.wait_idle(drain_timeout):
            self.cancel.set()
            self._slots.wait_idle(10.0)
        self.copier.close()

    def run(
        self,
        jobs: Sequence[Job],
        locations: Mapping[str, Location],
        on_result: Callable[[JobResult], None] | None = None,
        on_attempt: AttemptRecorder | None = None,
        *,
        stop: Callable[[], bool] | None = None,
    ) -> list[JobResult]:
        """Run ``jobs`` (blocking) and return their results in completion order. Once ``stop()`` is
        true no further job of this run starts: the rest end as cancelled (those in flight finish).

        ``on_result`` receives each job's result as it completes; ``on_attempt`` each copy attempt
        (the history): ``(job, source, bytes, started, duration, error or None)``."""
        todo: queue.SimpleQueue[Job] = queue.SimpleQueue()
        for job in jobs:
            todo.put(job)
        results: list[JobResult] = []
        lock = threading.Lock()

        def finish(res: JobResult) -> None:
            with lock:
                results.append(res)
            if on_result is not None:
                on_result(res)

        def worker() -> None:
            # A worker keeps its slot from job to job and gives it back only when paused, stopped,
            # resized below use or out of jobs: handing the slot to another thread after every job
            # cost a thread wake-up per shard, most of the interpreter's time on a fast local sync.
            while self._slots.acquire(give_up=todo.empty):
                try:
                    while True:
                        try:
                            job = todo.get_nowait()
                        except queue.Empty:
                            self._slots.wake_waiters()  # the others waiting for a slot can go home
                            return
                        if stop is not None and stop():
                            finish(JobResult(job, ok=False, cancelled=True, error="stopped: writer lease lost"))
                            continue
                        finish(self.run_job(job, locations, on_attempt))
                        if not self._slots.keep():
                            break
                finally:
                    self._slots.release()
            while True:  # stopped (closed): what nobody started ends as cancelled
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                finish(JobResult(job, ok=False, cancelled=True, error="stopped"))

        n = min(len(jobs), self.max_workers)
        threads = [start_named_thread(worker, f"ferry-copy-{i}") for i in range(n)]
        for t in threads:
            t.join()
        return results

    def _sleep(self, attempt: int) -> bool:
        """Back off before the next round; False when cancelled."""
        base, cap = self.backoff
        delay = min(cap, base * (2 ** (attempt - 1))) * self._rng.uniform(0.5, 1.5)
        return not self.cancel.wait(delay)

    def run_job(self, job: Job, locations: Mapping[str, Location], record: AttemptRecorder | None = None) -> JobResult:
        """Run one job to its end (verified, failed, or cancelled), on the calling worker's slot."""
        shard = job.shard
        dst = locations[job.dest]
        result = JobResult(job, ok=False)
        t0 = time.monotonic()
        if job.verify_first:
            try:
                problem = self.copier.verify(dst, shard.path, shard.size, shard.digest, cancel=self.cancel)
            except Cancelled:
                result.cancelled, result.error = True, "stopped"
                return result
            except StorageError as exc:
                problem = str(exc)
            if problem is None:
                result.ok, result.seconds = True, time.monotonic() - t0
                return result
            if problem != "missing":
                result.corrupt += 1
                self.stats.corrupt(job.dataset, job.dest)
        fatal_sources: set[str] = set()
        for attempt in range(1, self.retries + 1):
            for src_name in job.sources:
                if src_name in fatal_sources:
                    continue
                src = locations.get(src_name)
                if src is None:
                    fatal_sources.add(src_name)
                    continue
                result.attempts += 1
                outcome = self._attempt(job, src_name, src, dst, result, record)
                if outcome is Outcome.OK:
                    result.ok, result.src, result.copied = True, src_name, True
                    result.seconds = time.monotonic() - t0
                    return result
                if outcome is Outcome.CANCELLED:
                    result.cancelled = True
                    return result
                if outcome is Outcome.REFUSED:
                    result.retryable, result.seconds = False, time.monotonic() - t0
                    return result
                if outcome is Outcome.FATAL:
                    fatal_sources.add(src_name)
            if len(fatal_sources) >= len(job.sources):
                result.retryable = False
                break
            if attempt < self.retries and not self._sleep(attempt):
                result.cancelled = True
                return result
        result.seconds = time.monotonic() - t0
        return result

    def _attempt(
        self, job: Job, src_name: str, src: Location, dst: Location, result: JobResult, record: AttemptRecorder | None
    ) -> Outcome:
        shard = job.shard
        link = link_name(src_name, job.dest)
        tid = self.stats.start(job.dataset, job.version, shard.path, src_name, job.dest, shard.size)
        last: list[float] = [time.monotonic(), 0.0]

        def progress(n: int) -> None:
            self.stats.progress(tid, n)
            last[1] += n
            now = time.monotonic()
            if self.events is not None and now - last[0] >= _PROGRESS_EVERY:
                self.events.publish(
                    "progress", dataset=job.dataset, shard=shard.path, source=src_name, destination=job.dest,
                    bytes_done=int(last[1]), bytes_total=shard.size, rate_bps=last[1] / max(now - t_start, 1e-3),
                )  # fmt: skip
                last[0] = now

        t_start = time.monotonic()
        started = time.time()
        try:
            self.copier.copy(src, dst, shard.path, shard.size, shard.digest, create_only=not job.replace,
                             link=link, progress=progress, cancel=self.cancel)  # fmt: skip
        except FerryError as exc:
            self.stats.finish(tid, ok=False)
            outcome = outcome_of(exc)
            if outcome is Outcome.CANCELLED:
                return outcome
            if isinstance(exc, (ShardDigestError, ShardFormatError)):
                self.stats.corrupt(job.dataset, job.dest)
                result.corrupt += 1
            else:
                self.stats.error(job.dataset, job.dest, retryable=outcome is Outcome.RETRY)
            if isinstance(exc, SourceMissing):
                result.error = f"shard {shard.path} is missing at {src_name} ({exc})"
            else:
                result.error, result.retryable = str(exc), outcome is Outcome.RETRY
            if record is not None:
                record(job, src_name, int(last[1]), started, time.monotonic() - t_start, result.error)
            return outcome
        self.stats.finish(tid, ok=True, nbytes=shard.size)
        result.bytes = shard.size
        if record is not None:
            record(job, src_name, shard.size, started, time.monotonic() - t_start, None)
        return Outcome.OK
