"""A copy reports its progress at a fine grain on every path, the current rate reads true during a sync
and decays when idle, and a dataset whose manifest cannot be read shows as an error cell."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Backend
from helpers import pack, running_service, wait_until

import ferry.service.transfer.transfer as transfer
from ferry.service.transfer.bandwidth import TokenBucket
from ferry.service.transfer.hashed_io import PROGRESS_BYTES, PROGRESS_SECONDS
from ferry.service.transfer.stats import Stats
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve

RATE = 1024 * 1024  # bytes/s the copies are limited to
SIZE = 2 * RATE + 12345  # two seconds and a bit at the limit: one 8 MiB chunk on every path


def _copy_with_progress(src: Any, dst: Any) -> list[tuple[float, int]]:
    data = os.urandom(SIZE)
    src.write_bytes("shards/a.bin", data)
    bucket = TokenBucket(RATE)
    calls: list[tuple[float, int]] = []
    transfer.copy_shard(src, dst, "shards/a.bin", SIZE, digest_bytes(data), throttle=bucket.take,
                        progress=lambda n: calls.append((time.monotonic(), n)))  # fmt: skip
    assert dst.read_bytes("shards/a.bin") == data
    return calls


@pytest.mark.parametrize("to", ["file", "memory", "s3"])
def test_progress_comes_at_least_every_mib_or_quarter_second(
    tmp_path: Path, to: str, request: pytest.FixtureRequest
) -> None:
    src = resolve(str(tmp_path / "src"))
    backend: Backend = request.getfixturevalue(f"{to}_backend")
    dst = resolve(backend.url("ds"), backend.storage_options)
    calls = _copy_with_progress(src, dst)
    sizes = [n for _, n in calls]
    gaps = [b - a for (a, _), (b, _) in zip(calls, calls[1:], strict=False)]
    assert sum(sizes) == SIZE and max(sizes) <= PROGRESS_BYTES
    # between reports (the store's set-up before the first is not a copy's progress): a flush is due
    # PROGRESS_SECONDS after the last, and one throttle step (an eighth of that) may pass first
    assert max(gaps) < PROGRESS_SECONDS * 2, gaps
    assert len(sizes) >= SIZE / RATE / PROGRESS_SECONDS * 0.75


def test_progress_when_the_source_is_s3(tmp_path: Path, s3_backend: Backend) -> None:
    src = resolve(s3_backend.url("ds"), s3_backend.storage_options)
    calls = _copy_with_progress(src, resolve(str(tmp_path / "dst")))
    assert len(calls) >= SIZE / RATE / PROGRESS_SECONDS * 0.75, calls
    gaps = [b - a for (a, _), (b, _) in zip(calls, calls[1:], strict=False)]
    assert sum(n for _, n in calls) == SIZE and max(gaps) < PROGRESS_SECONDS * 2, gaps


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
