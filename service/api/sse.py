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
from collections.abc import AsyncIterator, Callable

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


async def event_stream(
    backend: ApiBackend,
    is_disconnected: Callable[[], object],
    stopping: asyncio.Event,
    *,
    progress_interval: float = 0.5,
    min_flush_interval: float = 0.1,
    heartbeat: float = 15.0,
) -> AsyncIterator[bytes]:
    """Yield SSE frames until the client disconnects or the server stops."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[EventOut | None] = asyncio.Queue()
    progress: dict[str, EventOut] = {}
    overflow = False

    def put(ev: EventOut) -> None:
        nonlocal overflow
        if ev.kind == "progress":
            d = ev.data
            progress[f"{d.get('dataset')}|{d.get('shard')}|{d.get('dst')}"] = ev
        elif queue.qsize() < _QUEUE_MAX:
            queue.put_nowait(ev)
        else:
            overflow = True

    inbox: deque[EventOut] = deque()
    inbox_lock = threading.Lock()

    def drain() -> None:  # on the event loop: hand everything that arrived to put()
        with inbox_lock:
            batch = list(inbox)
            inbox.clear()
        for ev in batch:
            put(ev)

    def on_event(ev: EventOut) -> None:  # daemon thread → event loop, one wake-up per batch
        with inbox_lock:
            inbox.append(ev)
            first = len(inbox) == 1
        if first:  # a drain is not pending yet: schedule one (waking the loop per event costs the copies)
            with contextlib.suppress(RuntimeError):  # loop closed while the daemon still publishes
                loop.call_soon_threadsafe(drain)

    unsubscribe = backend.subscribe(on_event)
    seq = 0
    try:
        yield format_event("hello", {"time": time.time(), "status": backend.status().model_dump()}, seq)
        last_beat = last_flush = time.monotonic()
        while not stopping.is_set():
            pause = min_flush_interval - (time.monotonic() - last_flush)
            if pause > 0:  # at most one write per interval: a busy sync publishes hundreds of events a second
                await asyncio.sleep(pause)
            events: list[EventOut] = []
            try:
                first = await asyncio.wait_for(queue.get(), timeout=progress_interval)
            except asyncio.TimeoutError:
                first = None
            if first is not None:
                events.append(first)
                while not queue.empty():  # everything that queued up meanwhile goes out in the same write
                    item = queue.get_nowait()
                    if item is not None:
                        events.append(item)
            out: list[bytes] = []
            if overflow:
                overflow = False
                events.clear()
                while not queue.empty():
                    queue.get_nowait()
                seq += 1
                out.append(format_event("resync", {"time": time.time()}, seq))
            for ev in events:
                seq += 1
                out.append(format_event(ev.kind, {**ev.data, "time": ev.time}, seq))
            if progress:
                for p in progress.values():
                    seq += 1
                    out.append(format_event("progress", {**p.data, "time": p.time}, seq))
                progress.clear()
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
