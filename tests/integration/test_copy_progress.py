"""The current rate reads true during a sync and decays when idle, and a dataset whose manifest cannot be
read shows as an error cell (a copy's own progress on every path: tests/contracts/copy_paths.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import pack, running_service, wait_until

from ferry.service.transfer.stats import Stats

RATE = 1024 * 1024  # bytes/s the copies are limited to


def test_rate_reads_the_limit_while_copying_and_decays_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("ferry.service.transfer.stats.time.monotonic", lambda: clock[0])
    stats = Stats()
    tid = stats.start("ds", "v", "s", "a", "b", 100 * RATE)
    clock[0] += 60  # idle for a minute first: the rate must not average the copy over the idle time
    readings: list[float] = []
    for _ in range(80):  # 8 s at RATE, in progress steps of a tenth of a second, with a burst first
        stats.progress(tid, RATE // 10 + (RATE // 4 if not readings else 0))
        clock[0] += 0.1
        readings.append(stats.snapshot().rate_bps)
    assert all(r <= RATE * 1.15 for r in readings), max(readings)  # a quarter-second burst, spread
    assert all(abs(r - RATE) <= RATE * 0.05 for r in readings[45:]), readings[45:]  # steady: the limit
    clock[0] += 5
    assert stats.snapshot().rate_bps == 0.0  # idle: nothing in the window


def test_an_unreadable_manifest_is_an_error_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path, monkeypatch) as svc:
        pack(svc.east("broken"), 20)
        (Path(svc.east("broken")) / "manifest.json").write_text("{ not json")
        svc.client.sync()

        def source_cell() -> Any:
            cells = httpx.get(f"{svc.url}/api/v1/replicas").json()["cells"]
            found = [c for c in cells if c["dataset"] == "broken" and c["cluster"] == "east"]
            return found[0] if found and found[0]["state"] == "failed" else None

        cell = wait_until(source_cell, 30, "the unreadable source to show as failed")
        assert cell["role"] == "source" and cell["percent"] == 0.0
