"""Fault injection: 10% failed reads and writes, 10% flipped bytes; the sync still completes, verified."""

from __future__ import annotations

from typing import Any

import pytest
from faults import faulty_location
from helpers import documents, make_docs, pack

from ferry.service.replication.engine import Engine, listing
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.service.transfer.stats import Stats
from ferry.shard_tools.errors import FerryError
from ferry.shard_tools.storage.store import TEMP_MARKER, resolve


@pytest.mark.parametrize("dst_kind", ["memory", "file"])
def test_sync_survives_failures_and_corruption(file_backend: Any, memory_backend: Any, dst_kind: str) -> None:
    src_url = file_backend.url("faulty-src")
    docs = make_docs(1200, 11)
    result = pack(src_url, docs, {})
    assert result.shards >= 50
    dst_b = memory_backend if dst_kind == "memory" else file_backend
    # A flipped chunk is only caught if its transfer reaches the hash; a read or write failure later in
    # the same transfer ends it first. With a handful of flips per run, a run can (rarely, depending on
    # thread interleaving) see every flip cut short that way, so up to three runs (fresh destinations,
    # other seeds) must show at least one detection; every run must complete and verify.
    for attempt, seed in enumerate((3, 5, 7)):
        snap, injected = _faulty_sync(src_url, dst_b, f"faulty-dst-{attempt}", seed)
        assert injected["read"] > 0 and injected["write"] > 0 and injected["flip_delivered"] > 0
        assert snap.corrupt_detected <= injected["flip_delivered"]
        assert sum(e.count for e in snap.errors if e.kind == "corrupt") == snap.corrupt_detected
        assert documents(dst_b.url(f"faulty-dst-{attempt}"), dst_b.storage_options) == [d.tolist() for d in docs]
        assert [p for p in listing(resolve(dst_b.url(f"faulty-dst-{attempt}"))) if TEMP_MARKER in p] == []
        if snap.corrupt_detected > 0:
            break
    else:
        pytest.fail("no corrupted transfer was detected in three runs with 10% flipped bytes")


def _faulty_sync(src_url: str, dst_b: Any, name: str, seed: int) -> tuple[Any, Any]:
    """One sync (passes repeated like the daemon's polls) through 10% read/write failures and flips."""
    src = faulty_location(resolve(src_url), read_fail=0.1, write_fail=0.1, flip=0.1, seed=seed)
    dst = faulty_location(resolve(dst_b.url(name)), read_fail=0.1, write_fail=0.1, flip=0.1, seed=seed + 1)
    stats = Stats()
    eng = Engine(Executor(transfers=4, stats=stats, retries=8, backoff=(0.001, 0.005)), State(None))
    published = False
    for _ in range(30):  # the daemon's polls: a pass that fails (e.g. a manifest write) is simply run again
        try:
            res = eng.sync_pass("ds", "src", "dst", {"src": src, "dst": dst})
        except FerryError:
            continue
        if res.published or res.up_to_date:
            published = True
            break
    assert published
    return stats.snapshot(), src.fs.injected + dst.fs.injected
