"""Server-Sent Events: bridge daemon callbacks (any thread) to one asyncio stream per client.

Progress events arrive many times a second per transfer; each stream coalesces them to the
latest per transfer and flushes at most every ``progress_interval`` so a slow client never
backs up the daemon. Other events are delivered in order, batched: a stream writes at most
once per ``min_flush_interval`` (0.1 s), however many events a fast sync publishes. If a
client falls too far behind, it gets one ``resync`` event (reload everything) instead of an
unbounded queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable

from pydantic_core import to_jsonable_python

from .backend import ApiBackend
from .models import EventOut

__all__ = ["format_event", "event_stream"]

_QUEUE_MAX = 1000


def format_event(kind: str, data: object, event_id: int | None = None) -> bytes:
    """One SSE frame: ``event:``, optional ``id:``, one ``data:`` line of JSON, blank line."""
    head = f"event: {kind}\n"
    if event_id is not None:
        head += f"id: {event_id}\n"
    return (head + "data: " + json.dumps(data, separators=(",", ":"), default=str) + "\n\n").encode()


class _Outbox:
    """Events on their way from daemon threads to one SSE client, on the client's event loop.

    Progress events are coalesced per transfer (the newest wins); other events queue up to
    ``_QUEUE_MAX``, beyond which the client is told to ``resync`` instead.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[EventOut] = asyncio.Queue()
        self._progress: dict[str, EventOut] = {}
        self._overflow = False
        self._inbox: deque[EventOut] = deque()
        self._inbox_lock = threading.Lock()

    def on_event(self, ev: EventOut) -> None:
        """From a daemon thread: hand ``ev`` to the loop, one wake-up per batch."""
        with self._inbox_lock:
            self._inbox.append(ev)
            first = len(self._inbox) == 1
        if first:  # a drain is not pending yet: schedule one (waking the loop per event costs the copies)
            with contextlib.suppress(RuntimeError):  # loop closed while the daemon still publishes
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:  # on the event loop
        with self._inbox_lock:
            batch = list(self._inbox)
            self._inbox.clear()
        for ev in batch:
            if ev.kind == "progress":
                d = ev.data
                self._progress[f"{d.get('dataset')}|{d.get('shard')}|{d.get('destination')}"] = ev
            elif self._queue.qsize() < _QUEUE_MAX:
                self._queue.put_nowait(ev)
            else:
                self._overflow = True

    async def collect(self, timeout: float) -> list[EventOut]:
        """The queued events: waits up to ``timeout`` for the first, then takes all that queued meanwhile."""
        try:
            first = await asyncio.wait_for(self._queue.get(), timeout=timeout)
        except asyncio.TimeoutError:
            return []
        events = [first]
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events

    def frames(self, events: list[EventOut], seq: int) -> tuple[list[bytes], int]:
        """SSE frames for ``events`` and the coalesced progress (or one ``resync``); the last sequence number."""
        out: list[bytes] = []
        if self._overflow:
            self._overflow = False
            events = []
            while not self._queue.empty():
                self._queue.get_nowait()
            seq += 1
            out.append(format_event("resync", {"time": time.time()}, seq))
        for ev in [*events, *self._progress.values()]:
            seq += 1
            out.append(format_event(ev.kind, {**ev.data, "time": ev.time}, seq))
        self._progress.clear()
        return out, seq


async def event_stream(
    backend: ApiBackend,
    is_disconnected: Callable[[], object],
    stopping: asyncio.Event,
    *,
    progress_interval: float = 0.5,
    min_flush_interval: float = 0.1,
    heartbeat: float = 15.0,
) -> AsyncGenerator[bytes, None]:
    """Yield SSE frames until the client disconnects or the server stops."""
    box = _Outbox(asyncio.get_running_loop())
    unsubscribe = backend.subscribe(box.on_event)
    seq = 0
    try:
        yield format_event("hello", {"time": time.time(), "status": to_jsonable_python(backend.status())}, seq)
        last_beat = last_flush = time.monotonic()
        while not stopping.is_set():
            pause = min_flush_interval - (time.monotonic() - last_flush)
            if pause > 0:  # at most one write per interval: a busy sync publishes hundreds of events a second
                await asyncio.sleep(pause)
            out, seq = box.frames(await box.collect(progress_interval), seq)
            if not out and time.monotonic() - last_beat >= heartbeat:
                out.append(b": keep-alive\n\n")
            if out:
                last_beat = last_flush = time.monotonic()
                yield b"".join(out)
            if await _maybe_await(is_disconnected()):
                break
    finally:
        unsubscribe()


async def _maybe_await(value: object) -> bool:
    if asyncio.iscoroutine(value):
        return bool(await value)
    return bool(value)
