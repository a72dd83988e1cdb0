"""The daemon's SQLite state: a verified shard's replica and status land together or not at all,
buffered and committed in batches that every read sees."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from ferry.service.records import EGRESS_VERSIONS
from ferry.service.replication.columns import strings
from ferry.service.replication.planner import SourceColumns
from ferry.service.replication.state import (
    _FOLD_AT,
    BATCH_SECONDS,
    BATCH_STATEMENTS,
    DB_NAME,
    SCHEMA_VERSION,
    State,
    fold_sets,
    unpack_paths,
)
from ferry.shard_tools.format.manifest import digest_column


def _committed_replicas(state_dir: Path) -> set[str]:
    """What another connection (another process, or the same daemon after a crash) finds on disk."""
    with sqlite3.connect(state_dir / DB_NAME) as db:
        log = db.execute("SELECT removed, paths FROM verified_sets ORDER BY id").fetchall()
    return set(fold_sets([(bool(removed), unpack_paths(blob)) for removed, blob in log]).to_pylist())


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


def test_verified_sets_take_adds_and_removals_in_order_and_fold_a_long_log(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.add_verified("ds", "west", ["shards/a", "shards/b"])
    state.mark_bad("ds", "west", "shards/a", "digest mismatch")  # no longer verified there
    assert state.verified("ds", "west") == {"shards/b"}
    state.shard_verified("ds", "v1", "west", "shards/a", attempts=1, size=10)  # repaired: verified again
    state.forget("ds", "west", ["shards/b"])  # deleted by retention
    assert state.verified("ds", "west") == {"shards/a"} and state.verified("ds", "east") == set()
    assert state.verified_clusters("ds") == ["west"] and state.replicas("ds") == {"shards/a": ["west"]}
    more = {f"shards/{i}" for i in range(_FOLD_AT + 5)}
    for path in sorted(more):
        state.add_verified("ds", "west", [path, "shards/a"])  # a path verified twice is there once
    column = state.verified_paths("ds", "west")
    assert sorted(column.to_pylist()) == sorted(more | {"shards/a"})
    with sqlite3.connect(tmp_path / "state" / DB_NAME) as db:
        assert db.execute("SELECT COUNT(*) FROM verified_sets WHERE cluster='west'").fetchone()[0] == 1  # folded
    state.close()
    again = State(tmp_path / "state")
    assert again.verified("ds", "west") == more | {"shards/a"}
    again.close()


def test_a_schema_1_state_directory_is_migrated(tmp_path: Path) -> None:
    """Schema 1 kept a row per verified copy (replicas) and per verified shard (shard_status)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.executescript(
            "CREATE TABLE replicas (dataset TEXT NOT NULL, cluster TEXT NOT NULL, path TEXT NOT NULL, "
            "verified_at REAL NOT NULL, PRIMARY KEY (dataset, cluster, path)) WITHOUT ROWID;"
            "CREATE TABLE shard_status (id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL, "
            "version TEXT NOT NULL, dest TEXT NOT NULL, path TEXT NOT NULL, size INTEGER NOT NULL DEFAULT 0, "
            "status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, retryable INTEGER, "
            "updated REAL NOT NULL, UNIQUE (dataset, version, dest, path));"
            "INSERT INTO replicas VALUES ('ds', 'west', 'shards/a', 1.0), ('ds', 'west', 'shards/b', 1.0), "
            "('ds', 'north', 'shards/a', 1.0);"
            "INSERT INTO shard_status (dataset, version, dest, path, status, last_error, retryable, updated) VALUES "
            "('ds', 'v1', 'west', 'shards/a', 'verified', NULL, NULL, 1.0), "
            "('ds', 'v1', 'west', 'shards/c', 'failed', 'boom', 0, 2.0);"
            "PRAGMA user_version = 1;"
        )
    state = State(state_dir)
    assert state.schema_version() == SCHEMA_VERSION
    assert state.verified("ds", "west") == {"shards/a", "shards/b"} and state.verified("ds", "north") == {"shards/a"}
    assert state.fatal("ds", "west") == {"shards/c"} and [e.reason for e in state.errors()] == ["boom"]
    state.close()
    with sqlite3.connect(state_dir / DB_NAME) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        statuses = db.execute("SELECT path, status FROM shard_status").fetchall()
    assert "replicas" not in tables and statuses == [("shards/c", "failed")]


def test_a_published_version_is_recorded_first_in_manifest_order(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    state.add_verified("ds", "west", ["shards/old", "shards/c", "shards/a"])  # in the order copies finished
    state.mark_bad("ds", "west", "shards/old", "corrupt")
    state.add_verified("ds", "west", ["shards/kept"])
    version = strings(["shards/a", "shards/b", "shards/c"])
    state.verified_version("ds", "west", version)
    column = state.verified_paths("ds", "west")
    assert column.to_pylist() == ["shards/a", "shards/b", "shards/c", "shards/kept"]
    # the next version (rows appended) finds its verified rows by one comparison of the prefix
    cols = SourceColumns("v2", strings(["shards/a", "shards/b", "shards/c", "shards/d", "shards/a"]),
                         np.ones(5, dtype=np.int64), digest_column(strings(["xxh128:" + "0" * 32] * 5)))  # fmt: skip
    assert cols.has(column).tolist() == [True, True, True, False, False]  # a repeat further down: looked up again
    assert cols.has(["shards/kept", "shards/d"]).tolist() == [False, False, False, True, False]
    state.close()


def test_an_unreadable_verified_set_is_forgotten_not_trusted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = State(tmp_path / "state")
    state.add_verified("ds", "west", ["shards/a"])
    state.add_verified("ds", "east", ["shards/a"])
    state.close()
    with sqlite3.connect(tmp_path / "state" / DB_NAME) as db:
        db.execute("UPDATE verified_sets SET paths = x'00ff00' WHERE cluster = 'west'")
    state = State(tmp_path / "state")
    assert state.verified("ds", "west") == set() and "unreadable" in caplog.text  # re-hashed by the next pass
    assert state.verified("ds", "east") == {"shards/a"}
    state.shard_verified("ds", "v1", "west", "shards/b", attempts=1, size=1)
    assert state.verified("ds", "west") == {"shards/b"}
    state.close()


def test_egress_adds_every_attempts_bytes_per_version_and_link_and_keeps_the_newest(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    t = 1000.0
    for i in range(EGRESS_VERSIONS + 2):  # v0 .. v6 over east->west, one after the other
        state.record_transfer("ds", f"v{i}", "shards/a", "east", "west", 100, t + i, 1.0, True, None)
        state.record_transfer("ds", f"v{i}", "shards/b", "east", "west", 40, t + i, 0.5, False, "reset")  # failed
    state.record_transfer("ds", "v6", "shards/b", "hub", "west", 60, t + 9, 0.5, True, None)  # a peer, once
    state.record_transfer("ds", "v6", "shards/c", "west", "west", 70, t + 9, 0.5, True, None)  # in place: no link
    state.record_transfer("ds", "v6", "shards/d", "east", "west", 0, t + 9, 0.1, False, "refused")  # no bytes
    state.close()
    state = State(tmp_path / "state")  # kept across a restart
    got = [(e.source, e.destination, e.version, e.bytes) for e in state.egress()]
    newest = [("east", "west", f"v{i}", 140) for i in range(EGRESS_VERSIONS + 1, 1, -1)]
    assert got == [*newest, ("hub", "west", "v6", 60)]
    assert [e.version for e in state.egress(per_link=2)] == ["v6", "v5", "v6"]
    state.close()
