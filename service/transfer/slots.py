"""The executor's transfer slots: how many copies may run at once, paused and resized at run time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Slots"]


class Slots:
    """A semaphore whose size can change at run time, held shut by pause, closed for good by close()."""

    def __init__(self, size: int) -> None:
        lock = threading.Lock()
        self._free = threading.Condition(lock)  # acquirers wait here: one is woken per released slot
        self._idle = threading.Condition(lock)  # wait_idle() waits here
        self._size = size
        self._used = 0
        self.paused = False
        self.closed = False

    def _wake_all(self) -> None:
        self._free.notify_all()
        self._idle.notify_all()

    def resize(self, size: int) -> None:
        with self._free:
            self._size = size
            self._wake_all()

    @property
    def size(self) -> int:
        return self._size

    def set_paused(self, paused: bool) -> None:
        with self._free:
            self.paused = paused
            self._wake_all()

    def close(self) -> None:
        with self._free:
            self.closed = True
            self._wake_all()

    def acquire(self, give_up: Callable[[], bool] | None = None) -> bool:
        """Take a slot (True), or return False once closed or once ``give_up()`` holds while waiting."""
        with self._free:
            while not self.closed and (self.paused or self._used >= self._size):
                if give_up is not None and give_up():
                    return False
                self._free.wait(0.5)
            if self.closed:
                return False
            self._used += 1
            return True

    def keep(self) -> bool:
        """May a holder go on to its next job with its slot? Not when paused, closed or resized below use."""
        with self._free:
            return not (self.closed or self.paused or self._used > self._size)

    def wake_waiters(self) -> None:
        """Let every waiting ``acquire`` re-check (its ``give_up``)."""
        with self._free:
            self._wake_all()

    def release(self) -> None:
        with self._free:
            self._used -= 1
            # Wake one waiting worker per freed slot: waking every idle worker thread (up to
            # max_workers) on each release cost more than the copies of small shards.
            self._free.notify()
            if not self._used:
                self._idle.notify_all()

    def wait_idle(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._used:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left if left is None else min(left, 0.5))
            return True
