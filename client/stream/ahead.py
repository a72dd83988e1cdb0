"""Batches made ready ahead of the training loop while it runs its step, so that ``next()`` only takes a finished one.

The training process has work for every batch: without DataLoader workers it builds the batch; with workers it
receives and unpickles what a worker sent and widens the compact token arrays into tensors. Done in ``next()``
by a loop with a step, that is time the loop waits on data, with its caches cold after the step.
:class:`WhenIdle` does it in a helper thread once the loop has been away from ``next()`` for a moment (it is
running its step), and leaves a loop that asks back to back to do it itself: a hand-over between threads costs
such a loop more than it saves (measured without workers, and with two: a receiving thread that always ran
slowed a warm epoch).

Items reach the caller in order; an exception raised while producing an item reaches the caller in
its place, after every item before it, as it was raised (type, message, ``__cause__``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["WhenIdle"]

T = TypeVar("T")
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
