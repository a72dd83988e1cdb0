"""The daemon's SQLite state: a verified shard's replica, status and event land together or not at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from service.state import State


def _event(path: str, **extra: object) -> dict[str, object]:
    return {"type": "shard_verified", "ts": 1.5, "dataset": "ds", "shard": path, "dst": "west", **extra}


def test_shard_verified_writes_replica_status_and_event_in_one_transaction(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.mark_bad("ds", "west", "shards/a", "digest mismatch")
    state.mark("ds", "v1", "west", "shards/a", "failed", error="corrupt", retryable=True, attempts=1, size=10)
    state.shard_verified("ds", "v1", "west", "shards/a", attempts=2, size=10, event=_event("shards/a"))
    assert state.verified("ds", "west") == {"shards/a"}
    assert state.bad("ds", "west") == set()
    assert state.failed("ds", "west") == set()  # the status row moved from failed to verified
    assert state.events(1) == [{"type": "shard_verified", "ts": 1.5, "dataset": "ds", "shard": "shards/a",
                                "dst": "west"}]  # fmt: skip

    # the last statement fails (a timestamp SQLite cannot bind): the replica row written before it is
    # rolled back too — no replica without its status and event
    broken = {**_event("shards/b"), "ts": [1.5]}
    with pytest.raises(sqlite3.Error):
        state.shard_verified("ds", "v1", "west", "shards/b", attempts=1, size=10, event=broken)
    assert state.verified("ds", "west") == {"shards/a"}
    assert len(state.events(10)) == 1
    state.close()

    again = State(tmp_path / "state")  # and it is on disk
    assert again.verified("ds", "west") == {"shards/a"}
    again.close()
