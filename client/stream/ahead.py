"""Batches made ready by a thread ahead of the training loop, so that ``next()`` only takes a finished one.

With DataLoader workers the training process still has work for every batch: receiving and unpickling
what a worker sent, widening the compact token arrays into tensors, pinning them. Done in ``next()``
it is time the loop waits on data, a share of every step that grows as steps get shorter.
:class:`Ahead` does it in one thread while the loop runs its step, ``depth`` batches ahead; the thread
runs only while the step leaves the interpreter free (sleeping, waiting on the accelerator), as
DataLoader's own pin-memory thread does.

Without workers the training process builds every batch itself, and a loop with a step waits for that in
``next()``, with its caches cold after the step. :class:`WhenIdle` builds the next batch in a helper thread
once the loop has been away from ``next()`` for a moment (it is running its step), and leaves a loop that asks
back to back to build each batch itself: a hand-over between threads costs such a loop more than it saves.

Items reach the caller in order; an exception raised while producing an item reaches the caller in
its place, after every item before it, as it was raised (type, message, ``__cause__``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Generator, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Ahead", "WhenIdle"]

T = TypeVar("T")
_POLL_S = 0.05  # a blocked hand-over looks at the stop flag this often
_ITEM, _END, _ERROR = range(3)
_IDLE_MAX_S = 0.016  # WhenIdle's helper looks at a caller that asks back to back at least this often


def _unpack(kind: int, value: object) -> Any:
    """What an item of the hand-over stands for: the item itself, or the end or the error (raised) in its place."""
    if kind == _ITEM:
        return value
    if kind == _ERROR:
        assert isinstance(value, BaseException)
        raise value
    raise StopIteration


class Ahead(Generic[T]):
    """Iterates ``items`` in a thread, at most ``depth`` items ahead of the consumer.

    ``close()`` stops the thread and closes ``items`` (in the thread that ran it). The thread may be inside
    ``next(items)`` then: ``close`` waits for that item up to ``timeout`` seconds and says whether the thread
    ended, so that the caller can shut down what ``items`` waits on (DataLoader workers) either way.
    """

    def __init__(self, items: Generator[T, None, None], depth: int, name: str = "ferry-ahead") -> None:
        self._queue: queue.Queue[tuple[int, object]] = queue.Queue(max(1, depth))
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(items,), name=name, daemon=True)
        self._thread.start()

    def _run(self, items: Generator[T, None, None]) -> None:
        try:
            for item in items:
                if not self._put(_ITEM, item):
                    return
            self._put(_END, None)
        except BaseException as exc:  # noqa: BLE001 — every failure is the consumer's to see, in its place
            self._put(_ERROR, exc)
        finally:
            items.close()

    def _put(self, kind: int, value: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put((kind, value), timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        self._done = kind != _ITEM
        return _unpack(kind, value)

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread: True when it ended within ``timeout`` seconds."""
        self._stop.set()
        self._done = True
        while True:  # make room, so that a hand-over in progress returns at once
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
        return not self._thread.is_alive()


class WhenIdle(Generic[T]):
    """Iterates ``items`` in the caller's ``next()``, or ahead of it in a helper thread once the caller has spent
    ``delay`` seconds outside ``next()`` (running its step), so that the next ``next()`` takes a finished item.

    A loop that asks for items back to back builds each itself, with no hand-over between threads; a loop with a
    step finds each item ready. One item at most is built ahead. Whoever advances ``items`` holds ``lock``, which
    the owner of what ``items`` reads may take too, to read it between items. Items reach the caller in order;
    an exception raised while building an item reaches the caller in its place, as it was raised.
    """

    def __init__(
        self, items: Generator[T, None, None], delay: float, lock: threading.RLock, name: str = "ferry-idle"
    ) -> None:
        self._items, self._delay, self._lock = items, delay, lock
        self._ready: tuple[int, object] | None = None
        self._done = self._ended = self._asking = False
        self._taken = float("inf")  # monotonic time the caller took its last item (none yet: not before the first)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sleep = self._delay
        while True:  # bounded: close() sets the flags
            woken = self._wake.wait(sleep)
            if self._stop.is_set():
                return
            if woken:  # the caller took a finished item: it runs steps, so look again once it is in one
                self._wake.clear()
                sleep = self._delay
                continue
            # a caller that asks back to back finds nothing to build for it: look less often, to at most
            # _IDLE_MAX_S, so that the look does not take the interpreter from it a thousand times a second
            sleep = self._delay if self._build_if_idle() else min(2 * sleep, _IDLE_MAX_S)

    def _build_if_idle(self) -> bool:
        if self._ready is not None or self._ended or self._asking:
            return False
        if time.monotonic() - self._taken < self._delay or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._ready is not None or self._ended or self._stop.is_set():
                return False
            self._ready = self._advance()
            return True
        finally:
            self._lock.release()

    def _advance(self) -> tuple[int, object]:
        try:
            return _ITEM, next(self._items)
        except StopIteration:
            self._ended = True
            return _END, None
        except BaseException as exc:  # noqa: BLE001 — the caller's to see, in the item's place
            self._ended = True
            return _ERROR, exc

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        self._asking = True
        try:
            with self._lock:
                got, self._ready = self._ready, None
                if got is None:
                    got = self._advance()
                else:
                    self._wake.set()
        finally:
            self._asking = False
            self._taken = time.monotonic()
        kind, value = got
        self._done = kind != _ITEM
        return _unpack(kind, value)

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the helper and close ``items``: True when the helper ended within ``timeout`` seconds (a helper
        still building leaves ``items`` open)."""
        self._stop.set()
        self._wake.set()
        self._done = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        with self._lock:
            self._items.close()
        return True
