"""A tiny cache of serialized JSON responses, so many dashboards polling at once cost one read.

Entries live ``ttl`` seconds and are all dropped whenever the daemon reports a change (any
event but progress) or a control call succeeds, so a client never sees state older than a
change it caused or was told about.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

__all__ = ["ResponseCache", "dump_json"]


def dump_json(value: Any) -> bytes:
    """JSON bytes of a model or a list of models (pydantic-core does the work). ``Any``: a type checker sees
    a response model as its record of ferry.client.service.service_types (see models.py)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode()
    return b"[" + b",".join(item.model_dump_json().encode() for item in value) + b"]"


class ResponseCache:
    """Thread-safe ``key → bytes`` with a short time to live and a ``clear()`` for changes."""

    def __init__(self, ttl: float = 0.25) -> None:
        self._ttl = ttl
        self._entries: dict[str, tuple[float, int, bytes]] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def get(self, key: str, produce: Callable[[], Any]) -> bytes:
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
            generation = self._generation
        if hit is not None and hit[0] > now and hit[1] == generation:
            return hit[2]
        body = dump_json(produce())
        with self._lock:
            if self._generation == generation:  # a change since we read: do not store the stale body
                self._entries[key] = (now + self._ttl, generation, body)
        return body
