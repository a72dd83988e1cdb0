"""Batches made ready by a thread ahead of the training loop, so that ``next()`` only takes a finished one.

With DataLoader workers the training process still has work for every batch: receiving and unpickling
what a worker sent, widening the compact token arrays into tensors, pinning them. Done in ``next()``
it is time the loop waits on data, a share of every step that grows as steps get shorter.
:class:`Ahead` does it in one thread while the loop runs its step, ``depth`` batches ahead; the thread
runs only while the step leaves the interpreter free (sleeping, waiting on the accelerator), as
DataLoader's own pin-memory thread does.

Items reach the caller in order; an exception raised while producing an item reaches the caller in
its place, after every item before it, as it was raised (type, message, ``__cause__``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import Generic, TypeVar

__all__ = ["Ahead"]

T = TypeVar("T")
_POLL_S = 0.05  # a blocked hand-over looks at the stop flag this often
_ITEM, _END, _ERROR = range(3)


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
        if kind == _ITEM:
            return value  # type: ignore[return-value]  # what items yielded
        self._done = True
        if kind == _ERROR:
            assert isinstance(value, BaseException)
            raise value
        raise StopIteration

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
