"""One process's background fetches of whole shards into the node cache: the one owner of its threads, of the
shards asked for, and of their end.

Two kinds of request reach it. The loader's prefetch asks for the shards of the coming batches (``urgent``
false: two ``ferry-prefetch`` threads). The reader asks for a format-3 shard it is reading by frames because
the shard is not in the node cache yet (``urgent``: ``ferry-whole`` threads of their own, so that it never
queues behind shards wanted later). A window shuffle reads every shard of its window from its first batch on,
so the shards read now are fetched side by side, each on its own thread: the next one's parts fill the
connections the first one's leaves free (each ranks its parts by when its fetch started, see
:meth:`ferry.client.fetching.replicas.Replicas.for_later`), instead of starting only once the first one's
last parts are in, while a shard wanted later takes those connections.

A request may wait until the samples at hand are read (``after_gather``): a cold batch reads its frames first,
and a whole fetch started meanwhile would compete with them for the link.
The reader calls :meth:`Prefetcher.release` once the samples of a gather are read; deferred requests then start,
in the order they were made.

A shard is asked for once (:meth:`Prefetcher.asked`), and once more when it is asked for urgently after a plain
request handed it to a prefetch thread already (a second fetch of a shard waits on the cache's lock for the
first one, then finds it there); the record is bounded, since a shard evicted since may be wanted again.
:meth:`Prefetcher.settle` lets the running fetches end and drops the queued ones; the pools are made again by the
next request. A fetch's failure is the cache's to keep (see
:meth:`ferry.client.fetching.cache.ShardCache.ensure_in_background`): a read of the shard meets it again.
"""

from __future__ import annotations

from concurrent.futures import Future

from ferry.shard_tools.format.manifest import ShardInfo

from .cache import ShardCache
from .pools import DaemonPool

__all__ = ["Prefetcher"]

RECENT = 1024  # shards remembered as asked for (and as started)
_AHEAD_THREADS = 2
_WHOLE_THREADS = 2  # shards read now fetched side by side (the shards of a window of two)


class Prefetcher:
    """Whole shards of one dataset brought into ``cache`` by background threads of this process."""

    def __init__(self, cache: ShardCache, *, at_once: int = 0) -> None:
        self.cache = cache
        # urgent requests of one gather that start at once rather than after it: where the gathering thread reads
        # the frames itself (a local replica), a whole fetch on a core that would idle meanwhile takes nothing
        # from them
        self.at_once = at_once
        self._early = 0  # of this gather's requests, started at once
        self._ahead: DaemonPool | None = None  # the coming batches' shards
        self._whole: DaemonPool | None = None  # shards being read by frames now
        self._asked: dict[int, bool] = {}  # shard -> asked for urgently
        self._started: dict[int, Future[bool]] = {}  # handed to a thread
        self._waiting: list[tuple[int, ShardInfo, bool]] = []  # (shard, row, urgent) after the current gather

    def asked(self, s: int) -> bool:
        """Whether shard ``s`` was asked for (and not forgotten since)."""
        return s in self._asked

    @property
    def asked_count(self) -> int:
        return len(self._asked)

    def forget(self) -> None:
        """Forget the shards asked for: they may have been evicted since, and be wanted again."""
        self._asked.clear()

    def started(self, s: int) -> bool:
        """Whether shard ``s``'s whole fetch was handed to a thread (it is running, queued or done)."""
        return s in self._started

    def request(
        self, s: int, info: ShardInfo, *, urgent: bool = False, after_gather: bool = False, again: bool = False
    ) -> None:
        """Bring shard ``s`` (row ``info``) into the cache in the background: now, or once the samples at hand
        are read (``after_gather``). Asking again for a shard asked for already does nothing, unless this request
        is urgent and the first was not, or ``again`` (the shard may have been evicted since)."""
        before = self._asked.get(s)
        if not again and (before is True or (before is False and not urgent)):
            return
        if before is None and len(self._asked) >= RECENT:
            self._asked.clear()
        self._asked[s] = bool(before) or urgent
        if before is not None and self._upgrade(s, urgent):
            return
        if not after_gather or self._starts_early(urgent):
            self._start(s, info, urgent)
        else:
            self._waiting.append((s, info, urgent))

    def _starts_early(self, urgent: bool) -> bool:
        """Whether a request made during the gather at hand starts at once (the first ``at_once`` urgent ones)."""
        if urgent and self._early < self.at_once:
            self._early += 1
            return True
        return False

    def _upgrade(self, s: int, urgent: bool) -> bool:
        """Shard ``s``'s request still waiting, made urgent if this one is: False when none is waiting."""
        for k, (t, info, was) in enumerate(self._waiting):
            if t == s:
                if self._starts_early(urgent):
                    del self._waiting[k]
                    self._start(s, info, urgent)
                else:
                    self._waiting[k] = (t, info, was or urgent)
                return True
        return False

    def release(self) -> None:
        """The samples at hand are read: start the requests that waited for them, in the order they came."""
        self._early = 0
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, []
        for s, info, urgent in waiting:
            self._start(s, info, urgent)

    def _start(self, s: int, info: ShardInfo, urgent: bool) -> None:
        if urgent:
            if self._whole is None:
                self._whole = DaemonPool(_WHOLE_THREADS, "ferry-whole")
            pool = self._whole
        else:
            if self._ahead is None:
                self._ahead = DaemonPool(_AHEAD_THREADS, "ferry-prefetch")
            pool = self._ahead
        try:
            future = pool.submit(self.cache.ensure_in_background if urgent else self._for_later, info)
        except RuntimeError:
            return  # settled meanwhile from another thread (the loader closing): nothing to fetch for
        if len(self._started) >= RECENT:
            self._started.clear()
        self._started[s] = future

    def _for_later(self, info: ShardInfo) -> bool:
        """A plain request, on a prefetch thread: its parts yield the connections to those of shards read now."""
        with self.cache.replicas.for_later():
            return self.cache.ensure_in_background(info)

    def settle(self) -> None:
        """Let the running fetches end and drop the queued ones and the requests still waiting (those are
        forgotten: a later request starts them again). A DataLoader worker settles after its last batch, so
        that the counters it sends last count every request it made; the threads are made again by the next
        request."""
        for s, _, _ in self._waiting:
            self._asked.pop(s, None)
        self._waiting = []
        for pool in (self._ahead, self._whole):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._ahead = self._whole = None
        for s in [s for s, fut in self._started.items() if fut.cancelled()]:
            del self._started[s]
            self._asked.pop(s, None)
