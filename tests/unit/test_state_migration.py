"""A state directory written by release 0.1 opens with this release: its facts kept, its write-only
bookkeeping (the events table, 'pending' rows of planned shards) gone, its verified copies (a row
each) folded into one verified set per dataset and cluster, its schema version recorded."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from ferry.service.replication.state import DB_NAME, SCHEMA_VERSION, State
from ferry.shard_tools.errors import ConfigError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "state-0.1" / DB_NAME


def _copy(tmp_path: Path) -> Path:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    shutil.copyfile(FIXTURE, state_dir / DB_NAME)
    return state_dir


def _tables(db_path: Path) -> set[str]:
    with sqlite3.connect(db_path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_release_0_1_state_directory_is_migrated(tmp_path: Path) -> None:
    state_dir = _copy(tmp_path)
    assert "events" in _tables(state_dir / DB_NAME)  # the fixture is what 0.1 wrote
    state = State(state_dir)
    try:
        assert state.schema_version() == SCHEMA_VERSION
        # the durable facts are all there
        assert state.verified("alpha", "west") == {"shards/a"} and state.verified("alpha", "north") == {"shards/a"}
        assert state.bad("alpha", "north") == {"shards/z"}
        assert [(e.id, e.shard, e.reason, e.attempts) for e in state.errors() if e.version] == [
            (2, "shards/b", "shard shards/b: digest mismatch", 3)
        ]
        assert {(e.dataset, e.cluster) for e in state.errors() if not e.version} == {("beta", "east")}
        assert state.problems() == {("beta", "east", "manifest.json"), ("gamma", "east", "manifest.json")}
        assert [(h.shard, h.source, h.destination, h.ok) for h in state.history()] == [
            ("shards/b", "east", "west", False),
            ("shards/a", "east", "west", True),
        ]
        timings = {(v.dataset, v.cluster, v.version): (v.first_seen, v.completed) for v in state.version_timings()}
        assert timings[("alpha", "west", "v1")] == (990.0, None)
        assert timings[("alpha", "north", "v0")][0] == 900.0 and timings[("alpha", "north", "v0")][1] is not None
        assert [(r.dataset, r.cluster, r.bad) for r in state.scrubs()] == [("alpha", "north", ["shards/z"])]
        # an error id still resolves, and retry resets it
        assert state.error_exists(2) and state.reset_failed(2) == 1
    finally:
        state.close()
    assert "events" not in _tables(state_dir / DB_NAME)
    with sqlite3.connect(state_dir / DB_NAME) as db:
        statuses = db.execute("SELECT path, status FROM shard_status WHERE version != '' ORDER BY path").fetchall()
    # shards/c's planned row is gone, and so is shards/a's 'verified' row: the verified set holds it
    assert statuses == [("shards/b", "pending")]


def test_migration_runs_once_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    state_dir = _copy(tmp_path)
    State(state_dir).close()
    again = State(state_dir)  # already current: nothing to do, nothing lost
    assert again.verified("alpha", "west") == {"shards/a"}
    again.close()
    with sqlite3.connect(state_dir / DB_NAME) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(ConfigError, match="written by a newer ferry"):
        State(state_dir)
