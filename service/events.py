"""A thread-safe fan-out of event dicts to any number of bounded subscriber queues."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

__all__ = ["EventBus"]


class EventBus:
    """``publish`` never blocks: a full subscriber queue loses its oldest event."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: list[queue.Queue[dict[str, Any]]] = []

    def subscribe(
        self, maxsize: int = 1000, into: queue.Queue[dict[str, Any]] | None = None
    ) -> queue.Queue[dict[str, Any]]:
        """A queue receiving every event from now on: a new one of ``maxsize``, or ``into`` (bounded)."""
        q: queue.Queue[dict[str, Any]] = queue.Queue(maxsize) if into is None else into
        with self._lock:
            self._subs.append(q)
        return q

    def unsubscribe(self, q: queue.Queue[dict[str, Any]]) -> None:
        with self._lock:
            if q in self._subs:
                self._subs.remove(q)

    def publish(self, type_: str, **fields: Any) -> dict[str, Any]:
        return self.deliver({"type": type_, "ts": time.time(), **fields})

    def deliver(self, event: dict[str, Any]) -> dict[str, Any]:
        """Hand an event built elsewhere (``type``, ``ts``, fields) to every subscriber."""
        with self._lock:
            subs = list(self._subs)
        for q in subs:
            while True:
                try:
                    q.put_nowait(event)
                    break
                except queue.Full:
                    with contextlib.suppress(queue.Empty):
                        q.get_nowait()
        return event
