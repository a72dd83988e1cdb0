"""The daemon's SQLite state: a verified shard's replica and status land together or not at all,
buffered and committed in batches that every read sees."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from ferry.service.replication.state import BATCH_SECONDS, BATCH_STATEMENTS, DB_NAME, State


def _committed_replicas(state_dir: Path) -> set[str]:
    """What another connection (another process, or the same daemon after a crash) finds on disk."""
    with sqlite3.connect(state_dir / DB_NAME) as db:
        return {r[0] for r in db.execute("SELECT path FROM replicas")}


def test_shard_verified_writes_replica_and_status_together(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.mark_bad("ds", "west", "shards/a", "digest mismatch")
    state.mark("ds", "v1", "west", "shards/a", "failed", error="corrupt", retryable=True, attempts=1, size=10)
    state.shard_verified("ds", "v1", "west", "shards/a", attempts=2, size=10)
    assert state.verified("ds", "west") == {"shards/a"}  # a read sees the buffered write
    assert state.bad("ds", "west") == set()
    assert state.failed("ds", "west") == set()  # the status row moved from failed to verified

    # a value SQLite cannot store is refused at the call, before anything is buffered
    with pytest.raises(TypeError):
        state.shard_verified("ds", "v1", "west", "shards/b", attempts=1, size=[10])  # type: ignore[arg-type]
    assert state.verified("ds", "west") == {"shards/a"}
    state.close()

    again = State(tmp_path / "state")  # and it is on disk
    assert again.verified("ds", "west") == {"shards/a"}
    again.close()


def test_completed_copies_are_committed_in_batches_that_reads_and_flush_see(tmp_path: Path) -> None:
    state = State(tmp_path / "state", batch_seconds=60.0)  # no commit by age during this test
    for i in range(3):
        state.record_transfer("ds", "v1", f"shards/{i}", "east", "west", 10, time.time(), 0.01, True, None)
        state.shard_verified("ds", "v1", "west", f"shards/{i}", attempts=1, size=10)
    assert _committed_replicas(tmp_path / "state") == set()  # buffered: not one transaction per shard
    state.flush()
    assert _committed_replicas(tmp_path / "state") == {"shards/0", "shards/1", "shards/2"}
    assert [h.shard for h in state.history(10)] == ["shards/2", "shards/1", "shards/0"]  # order kept

    # a full buffer commits by itself
    per_shard = 4  # history row, replica, bad, status
    for i in range(BATCH_STATEMENTS // per_shard + 1):
        state.record_transfer("ds", "v1", f"full/{i}", "east", "west", 10, time.time(), 0.01, True, None)
        state.shard_verified("ds", "v1", "west", f"full/{i}", attempts=1, size=10)
    assert "full/0" in _committed_replicas(tmp_path / "state")
    state.shard_verified("ds", "v1", "west", "last", attempts=1, size=10)
    state.close()  # commits the rest
    assert "last" in _committed_replicas(tmp_path / "state")
    state.close()  # idempotent


def test_a_lone_write_is_committed_soon_with_nothing_else_happening(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.shard_verified("ds", "v1", "west", "lone", attempts=1, size=10)
    deadline = time.monotonic() + BATCH_SECONDS + 5.0
    while "lone" not in _committed_replicas(tmp_path / "state") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "lone" in _committed_replicas(tmp_path / "state")  # by the ferry-state thread
    state.close()


def test_a_batch_that_fails_rolls_back_whole(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.record_transfer("ds", "v1", "shards/a", "east", "west", 10, time.time(), 0.01, True, None)
    state.shard_verified("ds", "v1", "west", "shards/a", attempts=1, size=10)
    state._defer(("INSERT INTO no_such_table VALUES (1)", ()))
    with pytest.raises(sqlite3.OperationalError):
        state.flush()
    assert state.verified("ds", "west") == set() and state.history(10) == []  # nothing of the batch
    state.shard_verified("ds", "v1", "west", "shards/b", attempts=1, size=10)
    assert state.verified("ds", "west") == {"shards/b"}  # the state goes on working
    state.close()
