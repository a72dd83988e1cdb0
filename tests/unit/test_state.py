"""The daemon's SQLite state: a verified shard's replica, status and event land together or not at all,
buffered and committed in batches that every read sees."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from service import state as state_module
from service.state import DB_NAME, State


def _event(path: str, **extra: object) -> dict[str, object]:
    return {"type": "shard_verified", "ts": 1.5, "dataset": "ds", "shard": path, "dst": "west", **extra}


def _committed_replicas(state_dir: Path) -> set[str]:
    """What another connection (another process, or the same daemon after a crash) finds on disk."""
    with sqlite3.connect(state_dir / DB_NAME) as db:
        return {r[0] for r in db.execute("SELECT path FROM replicas")}


def test_shard_verified_writes_replica_status_and_event_together(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.mark_bad("ds", "west", "shards/a", "digest mismatch")
    state.mark("ds", "v1", "west", "shards/a", "failed", error="corrupt", retryable=True, attempts=1, size=10)
    state.shard_verified("ds", "v1", "west", "shards/a", attempts=2, size=10, event=_event("shards/a"))
    assert state.verified("ds", "west") == {"shards/a"}  # a read sees the buffered write
    assert state.bad("ds", "west") == set()
    assert state.failed("ds", "west") == set()  # the status row moved from failed to verified
    assert state.events(1) == [{"type": "shard_verified", "ts": 1.5, "dataset": "ds", "shard": "shards/a",
                                "dst": "west"}]  # fmt: skip

    # a value SQLite cannot store is refused at the call, before anything is buffered
    broken = {**_event("shards/b"), "ts": [1.5]}
    with pytest.raises(TypeError):
        state.shard_verified("ds", "v1", "west", "shards/b", attempts=1, size=10, event=broken)
    assert state.verified("ds", "west") == {"shards/a"}
    assert len(state.events(10)) == 1
    state.close()

    again = State(tmp_path / "state")  # and it is on disk
    assert again.verified("ds", "west") == {"shards/a"}
    again.close()


def test_completed_copies_are_committed_in_batches_that_reads_and_flush_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "_BATCH_SECONDS", 60.0)  # no commit by age during this test
    state = State(tmp_path / "state")
    for i in range(3):
        state.record_transfer("ds", "v1", f"shards/{i}", "east", "west", 10, time.time(), 0.01, True, None)
        state.shard_verified("ds", "v1", "west", f"shards/{i}", attempts=1, size=10, event=_event(f"shards/{i}"))
    assert _committed_replicas(tmp_path / "state") == set()  # buffered: not one transaction per shard
    state.flush()
    assert _committed_replicas(tmp_path / "state") == {"shards/0", "shards/1", "shards/2"}
    assert [h.shard for h in state.history(10)] == ["shards/2", "shards/1", "shards/0"]  # order kept

    # a full buffer commits by itself
    per_shard = 5  # history row, replica, bad, status, event
    for i in range(state_module._BATCH_STATEMENTS // per_shard + 1):
        state.record_transfer("ds", "v1", f"full/{i}", "east", "west", 10, time.time(), 0.01, True, None)
        state.shard_verified("ds", "v1", "west", f"full/{i}", attempts=1, size=10, event=_event(f"full/{i}"))
    assert "full/0" in _committed_replicas(tmp_path / "state")
    state.shard_verified("ds", "v1", "west", "last", attempts=1, size=10, event=_event("last"))
    state.close()  # commits the rest
    assert "last" in _committed_replicas(tmp_path / "state")
    state.close()  # idempotent


def test_a_lone_write_is_committed_soon_with_nothing_else_happening(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.shard_verified("ds", "v1", "west", "lone", attempts=1, size=10, event=_event("lone"))
    deadline = time.monotonic() + state_module._BATCH_SECONDS + 5.0
    while "lone" not in _committed_replicas(tmp_path / "state") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "lone" in _committed_replicas(tmp_path / "state")  # by the ferry-state thread
    state.close()


def test_a_batch_that_fails_rolls_back_whole(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.shard_verified("ds", "v1", "west", "shards/a", attempts=1, size=10, event=_event("shards/a"))
    state._defer(("INSERT INTO no_such_table VALUES (1)", ()))
    with pytest.raises(sqlite3.OperationalError):
        state.flush()
    assert state.verified("ds", "west") == set() and state.events(10) == []  # no replica without its event
    state.shard_verified("ds", "v1", "west", "shards/b", attempts=1, size=10, event=_event("shards/b"))
    assert state.verified("ds", "west") == {"shards/b"}  # the state goes on working
    state.close()
