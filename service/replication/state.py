"""Replication state in an embedded SQLite database (WAL): the durable facts of replication.

Tables::

    shard_status  (dataset, version, dest, path) → status failed|pending (pending: reset by retry),
                  attempts, last_error, retryable, size, updated: only shards that failed (a shard that
                  becomes verified drops its row); version '': a problem of the whole dataset, see
                  ``open_problem``
    verified_sets (dataset, cluster) → the paths of the verified copies known there: a log of path
                  sets (Arrow IPC blobs), each added or removed in order, folded into one blob when
                  the log grows (``verified_paths``); one row per batch of verified shards, not one per shard
    bad           (dataset, cluster, path) → found_at, reason (corrupt copy found by verify/scrub)
    transfers     history: dataset, version, path, src, dst, bytes, started, duration, ok, error
    versions      (dataset, cluster, version) → first_seen, completed  (lag and the SLA share)
    scrubs        dataset, cluster, checked, bad, repaired, started, duration

The open errors (/errors, /status, /metrics), the lag of every replica and the SLA share are
read from here and nowhere else. ``PRAGMA user_version`` is the schema version; ``_migrate``
brings a state directory of an older release up to it when it is opened.

One connection guarded by a lock serves every thread. The bookkeeping of a completed copy (its
history row, the verified replica and its status) is buffered and committed in batches:
every ``BATCH_STATEMENTS`` statements or ``batch_seconds`` after the first of them (the
``ferry-state`` thread), whichever comes first, and before any other read or write, so nothing
ever reads around the buffer (one transaction per shard, each waiting for the interpreter lock
several times, would be most of a fast local sync's time). A SIGKILL loses at most that
buffer: a restart re-plans from storage, and a shard whose verified mark was lost is re-hashed
where it lies (not copied again); its history row stays lost. Every other call is its own
transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ferry.shard_tools.errors import ConfigError
from ferry.shard_tools.threadname import start_named_thread

from ..records import EGRESS_VERSIONS, Egress, ErrorInfo, HistoryEntry, ScrubReport, VersionTiming
from .columns import EMPTY_STRINGS, common_prefix, strings

__all__ = [
    "State",
    "DB_NAME",
    "SCHEMA_VERSION",
    "BATCH_STATEMENTS",
    "BATCH_SECONDS",
    "pack_paths",
    "unpack_paths",
    "fold_sets",
]

log = logging.getLogger("ferry.state")

DB_NAME = "ferry-state.sqlite3"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS shard_status (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL, version TEXT NOT NULL, dest TEXT NOT NULL, path TEXT NOT NULL,
    size INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT, retryable INTEGER, updated REAL NOT NULL,
    UNIQUE (dataset, version, dest, path));
CREATE INDEX IF NOT EXISTS shard_status_by_state ON shard_status (status, updated);
CREATE TABLE IF NOT EXISTS verified_sets (
    id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL, cluster TEXT NOT NULL,
    removed INTEGER NOT NULL, paths BLOB NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS verified_sets_of ON verified_sets (dataset, cluster, id);
CREATE TABLE IF NOT EXISTS bad (
    dataset TEXT NOT NULL, cluster TEXT NOT NULL, path TEXT NOT NULL, found_at REAL NOT NULL, reason TEXT,
    PRIMARY KEY (dataset, cluster, path)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS transfers (
    id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT, version TEXT, path TEXT, src TEXT, dst TEXT,
    bytes INTEGER, started REAL, duration REAL, ok INTEGER, error TEXT);
CREATE TABLE IF NOT EXISTS egress (
    dataset TEXT NOT NULL, version TEXT NOT NULL, src TEXT NOT NULL, dst TEXT NOT NULL, bytes INTEGER NOT NULL,
    last REAL NOT NULL, PRIMARY KEY (dataset, version, src, dst)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS versions (
    dataset TEXT NOT NULL, cluster TEXT NOT NULL, version TEXT NOT NULL, first_seen REAL NOT NULL, completed REAL,
    PRIMARY KEY (dataset, cluster, version));
CREATE TABLE IF NOT EXISTS scrubs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT, cluster TEXT, checked INTEGER, bad TEXT, repaired TEXT,
    started REAL, duration REAL);
"""
SCHEMA_VERSION = 2
# What each older schema needs to become the next one: 0 → 1 (release 0.1 → 0.2) drops what
# nothing read: the events table (events go to subscribers only) and the 'pending' rows written for
# every planned shard ('copying' rows of releases before 0.1 with them). Problem rows (version '')
# stay: a reset problem is 'pending' and is read back by problems(). 1 → 2 folds the replicas table
# (one row per verified copy) into verified_sets (``_fold_replicas``) and drops the 'verified' rows of
# shard_status. A replicas table is made first where an older schema lacks it, so that every step runs.
_MIGRATIONS: dict[int, str] = {
    0: "DROP TABLE IF EXISTS events; "
    "DELETE FROM shard_status WHERE status IN ('pending', 'copying') AND version != '';",
    1: "CREATE TABLE IF NOT EXISTS replicas (dataset TEXT NOT NULL, cluster TEXT NOT NULL, path TEXT NOT NULL, "
    "verified_at REAL NOT NULL, PRIMARY KEY (dataset, cluster, path)) WITHOUT ROWID; "
    "DELETE FROM shard_status WHERE status = 'verified';",
}
_FOLD_AT = 64  # rows of one (dataset, cluster) in verified_sets that verified_paths folds into one
_KEEP_TRANSFERS = 100_000
_EGRESS_SQL = (
    "INSERT INTO egress (dataset, version, src, dst, bytes, last) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (dataset, version, src, dst) DO UPDATE SET bytes = egress.bytes + excluded.bytes, "
    "last = MAX(egress.last, excluded.last)"
)
BATCH_STATEMENTS = 256  # buffered statements (4 per copied shard) that trigger a commit
BATCH_SECONDS = 0.1  # the ferry-state thread commits a buffer this long after its first statement


_MARK_SQL = (
    "INSERT INTO shard_status (dataset, version, dest, path, size, status, attempts, last_error, retryable, "
    "updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (dataset, version, dest, path) DO UPDATE SET "
    "status = excluded.status, attempts = shard_status.attempts + excluded.attempts, "
    "last_error = COALESCE(excluded.last_error, CASE WHEN excluded.status = 'verified' THEN NULL "
    "ELSE shard_status.last_error END), retryable = excluded.retryable, updated = excluded.updated "
    "RETURNING id"
)
_PROBLEM_SQL = (
    "INSERT INTO shard_status (dataset, version, dest, path, size, status, attempts, last_error, retryable, "
    "updated) VALUES (?, '', ?, ?, 0, 'failed', 1, ?, ?, ?) ON CONFLICT (dataset, version, dest, path) DO UPDATE "
    "SET status = 'failed', attempts = shard_status.attempts + 1, last_error = excluded.last_error, "
    "retryable = excluded.retryable, updated = excluded.updated WHERE shard_status.status != 'failed' "
    "OR shard_status.last_error IS NOT excluded.last_error OR shard_status.retryable IS NOT excluded.retryable "
    "RETURNING id"
)


_VERIFIED = "-- verified path"  # a buffered verified copy: (dataset, cluster, path), committed as one set


def pack_paths(paths: Sequence[str] | pa.Array) -> bytes:
    """A set of paths as bytes: an Arrow IPC stream of one string column, zstd-compressed."""
    column = paths if isinstance(paths, pa.Array) else strings(paths)
    batch = pa.record_batch([column], names=["path"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def unpack_paths(blob: bytes) -> pa.StringArray:
    """The paths ``pack_paths`` wrote (its one batch's column itself: no copy of the decoded paths)."""
    with pa.ipc.open_stream(blob) as reader:
        column = reader.read_all().column(0)
    if column.num_chunks == 1:
        chunk = column.chunk(0)
        assert isinstance(chunk, pa.StringArray), column.type
        return chunk
    return column.combine_chunks() if column.num_chunks else EMPTY_STRINGS


def fold_sets(log: Sequence[tuple[bool, pa.StringArray]]) -> pa.StringArray:
    """The paths of a log of ``(removed, paths)`` sets applied in order, in the order they were added (a
    path added twice is there twice: ``pyarrow.compute.unique`` keeps the first of each)."""
    held: list[pa.Array] = []
    for removed, paths in log:
        if removed:
            current = pa.concat_arrays(held) if held else EMPTY_STRINGS
            held = [current.filter(pc.invert(pc.is_in(current, value_set=paths)))]
        else:
            held.append(paths)
    if len(held) == 1:
        return held[0]  # one set (the usual log, folded): itself, not a copy
    return pa.concat_arrays(held) if held else EMPTY_STRINGS


class State:
    """The daemon's database. ``State(None)`` keeps everything in memory (``ferry sync``)."""

    def __init__(self, state_dir: str | Path | None, *, batch_seconds: float = BATCH_SECONDS) -> None:
        """``batch_seconds``: how long a buffered write may wait for company before it is committed."""
        self.batch_seconds = batch_seconds
        if state_dir is None:
            target = ":memory:"
        else:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
            target = str(Path(state_dir) / DB_NAME)
        self._lock = threading.Lock()  # the connection
        self._pending: list[tuple[str, Sequence[Any]]] = []  # buffered writes, committed in order
        self._pending_since = 0.0
        self._pending_lock = threading.Lock()
        self._pending_added = threading.Condition(self._pending_lock)  # the flusher waits here
        self._closing = threading.Event()
        self._flusher: threading.Thread | None = None
        self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=30)
        if target != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()
        self._writes = 0
        self._closed = False

    def _migrate(self) -> None:
        """Create the tables, and bring an older release's database up to SCHEMA_VERSION (one transaction)."""
        found = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if found > SCHEMA_VERSION:
            self._db.close()
            raise ConfigError(
                f"state_dir: the state database was written by a newer ferry (schema {found}, this one knows "
                f"{SCHEMA_VERSION}): upgrade ferry, or start with an empty state_dir"
            )
        script = _SCHEMA + "".join(_MIGRATIONS[v] for v in range(found, SCHEMA_VERSION))
        try:
            self._db.executescript(f"BEGIN; {script}")  # the transaction stays open for the steps in Python
            if found < 2:
                self._fold_replicas()
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _fold_replicas(self) -> None:
        """Schema 1 → 2: the replicas table's rows become one verified set per (dataset, cluster)."""
        groups: dict[tuple[str, str], list[str]] = {}
        for dataset, cluster, path in self._db.execute("SELECT dataset, cluster, path FROM replicas"):
            groups.setdefault((dataset, cluster), []).append(path)
        now = time.time()
        self._db.executemany(
            "INSERT INTO verified_sets (dataset, cluster, removed, paths, at) VALUES (?, ?, 0, ?, ?)",
            [(dataset, cluster, pack_paths(paths), now) for (dataset, cluster), paths in groups.items()],
        )
        self._db.execute("DROP TABLE replicas")

    def schema_version(self) -> int:
        """The schema version of the open database (SCHEMA_VERSION once opened)."""
        return int(self._x("PRAGMA user_version")[0][0])

    def close(self) -> None:
        """Commit what is buffered and close the database; idempotent."""
        with self._pending_lock:
            self._closing.set()
            self._pending_added.notify_all()
        if self._flusher is not None:
            self._flusher.join(10)
        with self._lock:
            if self._closed:
                return
            self._commit_pending()
            self._db.close()
            self._closed = True

    @contextlib.contextmanager
    def _connection(self) -> Iterator[None]:
        """The connection, with every buffered write committed first (order kept, nothing read around it)."""
        with self._lock:
            self._commit_pending()
            yield

    def flush(self) -> None:
        """Commit the buffered writes now."""
        with self._connection():
            pass

    def _defer(self, *statements: tuple[str, Sequence[Any]]) -> None:
        """Buffer ``(sql, args)`` statements: committed when the buffer is full, by the next read or write,
        or by the flusher thread ``batch_seconds`` after the first of them, whichever comes first."""
        with self._pending_lock:
            if not self._pending:
                self._pending_since = time.monotonic()
                if self._flusher is None:
                    self._flusher = start_named_thread(self._flush_when_due, "ferry-state")
                self._pending_added.notify()
            self._pending.extend(statements)
            full = len(self._pending) >= BATCH_STATEMENTS
        if full:
            self.flush()

    def _flush_when_due(self) -> None:
        """The flusher: commits a buffer once its first statement is ``batch_seconds`` old."""
        while True:
            with self._pending_lock:
                while not self._pending and not self._closing.is_set():
                    self._pending_added.wait()
                due = self._pending_since + self.batch_seconds
            if self._closing.wait(max(0.0, due - time.monotonic())):
                return  # close() commits the rest
            try:
                self.flush()
            except sqlite3.Error:  # a bad batch is rolled back and dropped; a restart re-derives its marks
                log.exception("could not commit buffered state")

    def _commit_pending(self) -> None:
        """Under ``_lock``: the buffer in one transaction, one ``executemany`` per kind of statement."""
        with self._pending_lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        groups: dict[str, list[Sequence[Any]]] = {}  # first-seen order; each kind keeps its rows' order
        for sql, args in batch:
            groups.setdefault(sql, []).append(args)
        self._db.execute("BEGIN")
        try:
            for sql, rows in groups.items():
                if sql == _VERIFIED:  # one verified set per (dataset, cluster) of the batch, not a row per shard
                    self._add_sets(rows, removed=False)
                else:
                    self._db.executemany(sql, rows)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _x(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._connection():
            return self._db.execute(sql, args).fetchall()

    # shard status
    def mark(
        self,
        dataset: str,
        version: str,
        dest: str,
        path: str,
        status: str,
        *,
        error: str | None = None,
        retryable: bool | None = None,
        attempts: int = 0,
        size: int = 0,
    ) -> int:
        """Set one shard's status; returns its row id (the error id when ``status`` is failed)."""
        rows = self._x(_MARK_SQL, (dataset, version, dest, path, size, status, attempts, error, retryable, time.time()))
        return int(rows[0][0])

    def shard_verified(self, dataset: str, version: str, dest: str, path: str, *, attempts: int, size: int) -> None:
        """A shard became verified at ``dest``: its verified copy, and no open error of it any more, committed
        together (buffered). ``attempts`` and ``size`` are what the copy took (the history row has them)."""
        # values checked here, not when the buffer commits (where a bad one would fail the whole batch)
        size, attempts = int(size), int(attempts)
        if not isinstance(path, str):
            raise TypeError(f"a shard path is a str, not {type(path).__name__}")
        self._defer(
            (_VERIFIED, (dataset, dest, path)),
            ("DELETE FROM bad WHERE dataset=? AND cluster=? AND path=?", (dataset, dest, path)),
            ("DELETE FROM shard_status WHERE dataset=? AND version=? AND dest=? AND path=?",
             (dataset, version, dest, path)),
        )  # fmt: skip

    def failed(self, dataset: str, dest: str) -> set[str]:
        rows = self._x("SELECT path FROM shard_status WHERE dataset=? AND dest=? AND status='failed'", (dataset, dest))
        return {r[0] for r in rows}

    def fatal(self, dataset: str, dest: str) -> set[str]:
        """Shards that failed at ``dest`` with an error a retry cannot fix (until ``reset_failed``)."""
        rows = self._x(
            "SELECT path FROM shard_status WHERE dataset=? AND dest=? AND status='failed' AND retryable=0",
            (dataset, dest),
        )
        return {r[0] for r in rows}

    def errors(self, limit: int = 100) -> list[ErrorInfo]:
        rows = self._x(
            "SELECT id, dataset, version, dest, path, last_error, retryable, attempts, updated FROM shard_status "
            "WHERE status='failed' ORDER BY updated DESC LIMIT ?",
            (limit,),
        )
        return [
            ErrorInfo(
                id=r[0],
                at=r[8],
                dataset=r[1],
                version=r[2],
                cluster=r[3],
                shard=r[4],
                reason=r[5] or "",
                retryable=bool(r[6]),
                attempts=r[7],
            )  # fmt: skip
            for r in rows
        ]

    # dataset-level problems (a source manifest that cannot be read, a refused dataset name): rows of
    # shard_status with version '' and ``path`` naming what is wrong, so that they share error ids,
    # errors(), the metrics and reset_failed() with failed shards. No real version id is empty.
    def open_problem(self, dataset: str, cluster: str, subject: str, message: str, *, retryable: bool) -> int | None:
        """Record an open problem of ``dataset`` at ``cluster``; returns its error id when it is new (or
        reopened, or its message changed), None when that very problem was open already (no write)."""
        rows = self._x(_PROBLEM_SQL, (dataset, cluster, subject, message, retryable, time.time()))
        return int(rows[0][0]) if rows else None

    def clear_problem(self, dataset: str, cluster: str, subject: str) -> None:
        self._x("DELETE FROM shard_status WHERE dataset=? AND version='' AND dest=? AND path=?",
                (dataset, cluster, subject))  # fmt: skip

    def problems(self) -> set[tuple[str, str, str]]:
        """(dataset, cluster, subject) of every recorded problem, open or reset by reset_failed()."""
        rows = self._x("SELECT dataset, dest, path FROM shard_status WHERE version=''")
        return {(r[0], r[1], r[2]) for r in rows}

    def reset_failed(self, error_id: int | None = None) -> int:
        """Make failed shards pending again (one by id, or all); returns how many."""
        with self._connection():
            if error_id is None:
                cur = self._db.execute(
                    "UPDATE shard_status SET status='pending', attempts=0, updated=? WHERE status='failed'",
                    (time.time(),),
                )
            else:
                cur = self._db.execute(
                    "UPDATE shard_status SET status='pending', attempts=0, updated=? WHERE id=? AND status='failed'",
                    (time.time(), error_id),
                )
            return cur.rowcount

    def error_exists(self, error_id: int) -> bool:
        return bool(self._x("SELECT 1 FROM shard_status WHERE id=? AND status='failed'", (error_id,)))

    # verified copies (sets of paths per dataset and cluster) and known-bad copies
    def _add_sets(self, rows: Iterable[Sequence[Any]], *, removed: bool) -> None:
        """Under ``_lock``, in a transaction: ``(dataset, cluster, path)`` rows as one set per (dataset, cluster)."""
        sets: dict[tuple[str, str], list[str]] = {}
        for dataset, cluster, path in rows:
            sets.setdefault((dataset, cluster), []).append(path)
        now = time.time()
        self._db.executemany(
            "INSERT INTO verified_sets (dataset, cluster, removed, paths, at) VALUES (?, ?, ?, ?, ?)",
            [(d, c, int(removed), pack_paths(paths), now) for (d, c), paths in sets.items()],
        )

    def _change_sets(self, rows: Sequence[Sequence[Any]], *, removed: bool) -> None:
        if not rows:
            return
        with self._connection():
            self._db.execute("BEGIN")
            try:
                self._add_sets(rows, removed=removed)
                if not removed and self._db.execute("SELECT 1 FROM bad LIMIT 1").fetchone():
                    self._db.executemany("DELETE FROM bad WHERE dataset=? AND cluster=? AND path=?", rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def add_verified(self, dataset: str, cluster: str, paths: Iterable[str]) -> None:
        self._change_sets([(dataset, cluster, p) for p in paths], removed=False)

    def _known(self, dataset: str, cluster: str) -> tuple[int, pa.StringArray]:
        """Under ``_lock``: how many rows the log of ``cluster``'s verified sets has, and the paths it holds. A
        log that cannot be read is dropped with a warning: nothing is known verified there (re-hashed)."""
        rows = self._db.execute(
            "SELECT removed, paths FROM verified_sets WHERE dataset=? AND cluster=? ORDER BY id", (dataset, cluster)
        ).fetchall()
        try:
            return len(rows), fold_sets([(bool(removed), unpack_paths(blob)) for removed, blob in rows])
        except (pa.ArrowException, TypeError) as exc:
            log.warning("verified copies of %s at %s unreadable (%s): forgotten, they are checked again",
                        dataset, cluster, exc)  # fmt: skip
            self._db.execute("DELETE FROM verified_sets WHERE dataset=? AND cluster=?", (dataset, cluster))
            return 0, EMPTY_STRINGS

    def _replace_sets(self, dataset: str, cluster: str, paths: pa.StringArray) -> None:
        """Under ``_lock``: the log of ``cluster``'s verified sets becomes the one set ``paths``."""
        self._db.execute("BEGIN")
        try:
            self._db.execute("DELETE FROM verified_sets WHERE dataset=? AND cluster=?", (dataset, cluster))
            self._db.execute(
                "INSERT INTO verified_sets (dataset, cluster, removed, paths, at) VALUES (?, ?, 0, ?, ?)",
                (dataset, cluster, pack_paths(paths), time.time()),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def verified_paths(self, dataset: str, cluster: str) -> pa.StringArray:
        """The paths with a verified copy at ``cluster`` as an Arrow column (no Python object per path), in
        the order they were recorded (a path verified again may be there twice until the log is folded).
        A long log of sets is folded into one row on the way."""
        with self._connection():
            count, paths = self._known(dataset, cluster)
            if count > _FOLD_AT:
                paths = pc.unique(paths)  # first of each: a set recorded at a publish stays in manifest order
                self._replace_sets(dataset, cluster, paths)
        return paths

    def verified_version(self, dataset: str, cluster: str, paths: pa.StringArray) -> None:
        """A version was published at ``cluster``: every one of its ``paths`` is verified there. The verified
        set becomes one row that begins with them in manifest order (so that planning the next version
        compares that prefix instead of hashing it), followed by the other paths verified there."""
        with self._connection():
            _, known = self._known(dataset, cluster)
            m = common_prefix(known, paths)
            rest = known.slice(m)  # the paths known verified besides these (paths[:m] are known[:m])
            if len(rest) and m < len(paths):
                rest = rest.filter(pc.invert(pc.is_in(rest, value_set=paths.slice(m))))
            self._replace_sets(dataset, cluster, pa.concat_arrays([paths, rest]))

    def verified(self, dataset: str, cluster: str) -> set[str]:
        """The paths with a verified copy at ``cluster`` as a Python set (for small sets; see verified_paths)."""
        return set(self.verified_paths(dataset, cluster).to_pylist())

    def verified_clusters(self, dataset: str) -> list[str]:
        """The clusters where some verified copy of ``dataset`` may be known (their sets may be empty)."""
        rows = self._x("SELECT DISTINCT cluster FROM verified_sets WHERE dataset=? ORDER BY cluster", (dataset,))
        return [r[0] for r in rows]

    def replicas(self, dataset: str) -> dict[str, list[str]]:
        """path → clusters holding a verified copy (a Python dict: retention's, not the planner's)."""
        out: dict[str, list[str]] = {}
        for cluster in self.verified_clusters(dataset):
            for path in self.verified_paths(dataset, cluster).to_pylist():
                out.setdefault(path, []).append(cluster)
        return out

    def mark_bad(self, dataset: str, cluster: str, path: str, reason: str) -> None:
        self._change_sets([(dataset, cluster, path)], removed=True)
        self._x("INSERT OR REPLACE INTO bad VALUES (?, ?, ?, ?, ?)", (dataset, cluster, path, time.time(), reason))

    def bad(self, dataset: str, cluster: str) -> set[str]:
        return {r[0] for r in self._x("SELECT path FROM bad WHERE dataset=? AND cluster=?", (dataset, cluster))}

    def forget(self, dataset: str, cluster: str, paths: Iterable[str]) -> None:
        self._change_sets([(dataset, cluster, p) for p in paths], removed=True)

    # history
    def record_transfer(
        self, dataset: str, version: str, path: str, src: str, dst: str, nbytes: int, started: float,
        duration: float, ok: bool, error: str | None,
    ) -> None:  # fmt: skip
        statements: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT INTO transfers (dataset, version, path, src, dst, bytes, started, duration, ok, error) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (dataset, version, path, src, dst, int(nbytes), float(started), float(duration), int(ok), error),
            )
        ]
        if nbytes > 0 and src != dst:  # what the link carried, kept per version (the history is trimmed)
            statements.append((_EGRESS_SQL, (dataset, version, src, dst, int(nbytes), float(started + duration))))
        self._defer(*statements)
        self._trim()

    def egress(self, per_link: int = EGRESS_VERSIONS) -> list[Egress]:
        """Bytes each version sent over each link, the ``per_link`` versions last added to per link, newest
        first."""
        rows = self._x(
            "SELECT dataset, version, src, dst, bytes, last FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY src, dst "
            "ORDER BY last DESC) AS n FROM egress) WHERE n <= ? ORDER BY src, dst, last DESC",
            (per_link,),
        )
        return [Egress(r[0], r[1], r[2], r[3], int(r[4]), float(r[5])) for r in rows]

    def history(self, limit: int = 100, dataset: str | None = None) -> list[HistoryEntry]:
        where, args = ("WHERE dataset=?", [dataset]) if dataset else ("", [])
        rows = self._x(
            f"SELECT id, dataset, version, path, src, dst, bytes, started, duration, ok, error FROM transfers "
            f"{where} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [HistoryEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], bool(r[9]), r[10]) for r in rows]

    def _trim(self) -> None:
        self._writes += 1
        if self._writes % 1000 == 0:
            self._x("DELETE FROM transfers WHERE id < (SELECT MAX(id) FROM transfers) - ?", (_KEEP_TRANSFERS,))

    # versions (lag, SLA share)
    def seen_version(self, dataset: str, cluster: str, version: str, since: float) -> float:
        """Record that ``version`` is wanted at ``cluster`` since ``since`` (the earlier of when it was
        created and first seen); returns the time recorded first."""
        self._x("INSERT OR IGNORE INTO versions VALUES (?, ?, ?, ?, NULL)", (dataset, cluster, version, since))
        rows = self._x(
            "SELECT first_seen FROM versions WHERE dataset=? AND cluster=? AND version=?", (dataset, cluster, version)
        )
        return float(rows[0][0])

    def completed_version(self, dataset: str, cluster: str, version: str) -> None:
        """``version`` was published at ``cluster`` (now)."""
        self._x(
            "UPDATE versions SET completed=? WHERE dataset=? AND cluster=? AND version=? AND completed IS NULL",
            (time.time(), dataset, cluster, version),
        )

    def version_timings(self) -> list[VersionTiming]:
        """Every version a pass brought (or is bringing) to a cluster: when it was wanted, when published."""
        rows = self._x("SELECT dataset, cluster, version, first_seen, completed FROM versions")
        return [VersionTiming(r[0], r[1], r[2], float(r[3]), None if r[4] is None else float(r[4])) for r in rows]

    # scrubs
    def add_scrub(self, report: ScrubReport) -> None:
        self._x(
            "INSERT INTO scrubs (dataset, cluster, checked, bad, repaired, started, duration) VALUES (?,?,?,?,?,?,?)",
            (
                report.dataset,
                report.cluster,
                report.checked,
                json.dumps(report.bad),
                json.dumps(report.repaired),
                report.started_at,
                report.duration_s,
            ),
        )

    def scrubs(self, limit: int = 20) -> list[ScrubReport]:
        rows = self._x(
            "SELECT dataset, cluster, checked, bad, repaired, started, duration FROM scrubs ORDER BY id DESC LIMIT ?",
            (limit,),
        )
        return [ScrubReport(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4]), r[5], r[6]) for r in rows]
