"""The API's event pump hands the daemon's events to subscribers in order, collecting them in intervals
while they keep coming instead of being woken by the publishing copy thread for every one."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import TOKEN, TOKEN_ENV, make_config, wait_until

from ferry.service.api.daemon_backend import DaemonBackend
from ferry.service.api.models import EventOut
from ferry.service.daemon import Daemon


class CountingQueue(queue.Queue[dict[str, Any]]):
    """Counts the blocking gets that returned an event: each one is a wake-up of the pump by a publisher."""

    woken = 0

    def get(self, block: bool = True, timeout: float | None = None) -> dict[str, Any]:
        item = super().get(block, timeout)
        if block:
            self.woken += 1
        return item


def test_a_burst_of_events_arrives_in_order_with_few_wakeups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    config = make_config(tmp_path)
    daemon = Daemon(config)
    counting = CountingQueue(10_000)

    real_subscribe = daemon.events.subscribe
    monkeypatch.setattr(daemon.events, "subscribe", lambda maxsize=1000: real_subscribe(into=counting))
    backend = DaemonBackend(daemon, config.api)
    got: list[EventOut] = []
    lock = threading.Lock()

    def on_event(ev: EventOut) -> None:
        with lock:
            got.append(ev)

    unsubscribe = backend.subscribe(on_event)
    try:
        for i in range(200):  # a burst of a busy sync's progress events
            daemon.events.publish("progress", dataset="ds", shard=f"shards/{i}", bytes_done=i)
            time.sleep(0.001)
        wait_until(lambda: len(got) == 200, timeout=10, what="every event delivered")
        assert [ev.data["shard"] for ev in got] == [f"shards/{i}" for i in range(200)]
        assert counting.woken <= 10, counting.woken  # one wake-up per event before
    finally:
        unsubscribe()
        backend.close()
        daemon.state.close()
