"""The parts of one whole-shard fill, asked ahead of the thread that feeds them in order.

A fill feeds its parts in order to a decoder (:class:`ferry.client.fetching.fetch.ShardSink`), which costs its
thread CPU time for every part. If only that thread asked for the next parts, a part done while it decodes (or
while the head part is still on its way) would leave its connection idle until the thread came back, and on a
busy node the link would carry less than its parallel reads could. Here a read that ends asks the next part
at once, from the thread that ran it; the fill's thread only takes the parts in order.

Bounds: at most ``window`` reads not done yet (each holds a connection, or waits for one in the pool), and at
most ``2 * window`` reads asked and not yet taken (the memory a fill holds is about that many parts). Bytes that
arrived on the node already (:mod:`ferry.client.fetching.arrived`) are read from the disk when taken, so a part cut
into pieces around them counts only its reads: a bound on entries would ask fewer parts ahead on exactly the shards
a cold batch read frames of, and their fill would leave its connections to a shard wanted later. ``limit()``, when
given, lowers the first bound while it says so (never below one read, so the fill goes on), and :meth:`wake`
asks again at once when it rises: a fill for later batches while another process fetches a shard read now
(:meth:`ferry.client.fetching.replicas.Replicas.waiting_now`).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

__all__ = ["Entry", "PartQueue"]

#: (start, end, the read of [start, end) or None for bytes already on the node, the arrived spans seen then)
Entry = tuple[int, int, "Future[tuple[int, bytes]] | None", list[tuple[int, int]]]


class PartQueue:
    """Parts ``0 .. count-1``, each turned into queue entries by ``ask(k)`` (which starts their reads), taken in
    order by :meth:`take`; see the module docstring."""

    def __init__(
        self,
        count: int,
        window: int,
        ask: Callable[[int], Sequence[Entry]],
        limit: Callable[[], int] | None = None,
    ) -> None:
        self._count, self._window, self._ask, self._limit = count, max(1, window), ask, limit
        self._lock = threading.RLock()  # a read already done runs its callback in the thread adding it
        self._queue: collections.deque[Entry] = collections.deque()
        self._next = 0  # the next part to ask for
        self._busy = 0  # reads asked and not done
        self._held = 0  # reads asked and not taken (done or not): the bytes a fill holds
        self._asking = False  # a top-up is running (in this thread, when a callback comes back into it)
        self._stopped = False

    def take(self) -> Entry | None:
        """The next entry in order (its read may still run), or None when every part was taken."""
        with self._lock:
            self._top_up()
            if not self._queue:
                return None
            entry = self._queue.popleft()
            self._held -= entry[2] is not None
            self._top_up()
            return entry

    def wake(self) -> None:
        """Ask the parts the bounds allow now (``limit()`` rose)."""
        with self._lock, contextlib.suppress(Exception):  # as in _done: the fill's thread meets any error itself
            self._top_up()

    def stop(self) -> None:
        """Ask nothing more and cancel the reads not taken (those running end on their own)."""
        with self._lock:
            self._stopped = True
            left = [e[2] for e in self._queue if e[2] is not None]
            self._queue.clear()
        for fut in left:
            fut.cancel()

    def _top_up(self) -> None:
        """Ask parts while the bounds allow (under the lock)."""
        if self._asking:
            return
        self._asking = True
        try:  # from here on: _asking is reset whatever raises, limit() included
            busy = self._window if self._limit is None else max(1, min(self._window, self._limit()))
            while (
                not self._stopped and self._next < self._count and self._busy < busy and self._held < 2 * self._window
            ):
                entries = list(self._ask(self._next))
                self._next += 1
                reads = [e[2] for e in entries if e[2] is not None]
                self._busy += len(reads)
                self._held += len(reads)
                self._queue.extend(entries)
                for fut in reads:  # after the entries are queued: a read already done calls back at once
                    fut.add_done_callback(self._done)
        finally:
            self._asking = False

    def _done(self, _fut: Future[tuple[int, bytes]]) -> None:
        with self._lock:
            self._busy -= 1
            # a part that cannot be asked here (the pool refuses new reads at exit) is asked again by the fill's own
            # thread in take(), which meets the error: none is raised or logged in the thread that ran the read
            with contextlib.suppress(Exception):
                self._top_up()
