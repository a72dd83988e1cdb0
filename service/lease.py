"""The writer lease of a destination: one replicating writer per dataset copy, visibly.

A writer (the daemon, or ``ferry sync``) takes ``<dataset>/.ferry-lease.json`` before it
copies into a destination and keeps renewing it while it works; a second writer finds it
held, by whom and until when, and stays out (``LeaseHeldError``) instead of racing the first
one — publishing over it, or deleting its temp files as stale. Taking, renewing and
releasing are compare-and-swaps (:mod:`shard_tools.conditional`), so two writers that race
for a free lease cannot both win.

A lease ends when released, when it expires (``ttl`` seconds after the last renewal, by the
wall clock: hosts must agree on the time to well within ``ttl``), or at once when its holder
ran on this host and that process is gone (a killed writer does not block the next one for
``ttl``). Publishing does not depend on the lease: ``manifest.json`` is swapped by CAS
anyway, so even a writer that lost its lease while paused can never roll a destination back.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from shard_tools.conditional import read_versioned, write_if
from shard_tools.errors import LeaseHeldError, StorageError, WriteConflictError
from shard_tools.store import Location, process_alive
from shard_tools.threadname import start_named_thread

__all__ = ["LEASE_FILE", "DEFAULT_TTL", "LeaseInfo", "Lease", "read_lease"]

LEASE_FILE = ".ferry-lease.json"
DEFAULT_TTL = 60.0
_HOST = socket.gethostname()


@dataclass(frozen=True)
class LeaseInfo:
    """What a lease file says: who holds it and until when (seconds since the epoch)."""

    holder: str
    kind: str
    host: str
    pid: int
    acquired_at: float
    expires_at: float

    def expired(self, now: float) -> bool:
        gone = self.host == _HOST and self.pid != os.getpid() and not process_alive(self.pid)
        return now >= self.expires_at or gone

    def describe(self) -> str:
        left = max(0.0, self.expires_at - time.time())
        return f"{self.kind} {self.holder} (pid {self.pid} on {self.host}, lease for {left:.0f} s more)"

    @classmethod
    def parse(cls, data: bytes) -> LeaseInfo | None:
        """The lease in ``data``; None for a file that is not one (treated as free)."""
        try:
            doc = json.loads(data)
            return cls(
                holder=str(doc["holder"]), kind=str(doc["kind"]), host=str(doc["host"]), pid=int(doc["pid"]),
                acquired_at=float(doc["acquired_at"]), expires_at=float(doc["expires_at"]),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None


def read_lease(loc: Location) -> LeaseInfo | None:
    """The lease at ``loc`` if someone holds it now (None: free, expired or released)."""
    got = read_versioned(loc, LEASE_FILE)
    info = LeaseInfo.parse(got.data) if got.data is not None else None
    return info if info is not None and not info.expired(time.time()) else None


class Lease:
    """This process' lease on one destination. ``acquire`` or fail; ``keep`` renews it from a
    thread until ``release``. Use as a context manager: ``with Lease(loc, "sync"): ...``."""

    def __init__(self, loc: Location, kind: str, *, ttl: float = DEFAULT_TTL) -> None:
        if ttl <= 0:
            raise ValueError("lease ttl must be positive")
        self.loc = loc
        self.kind = kind
        self.ttl = ttl
        self.holder = f"{kind}:{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._token: str | None = None
        self._acquired_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why the lease was lost while held (None: still ours)

    def _body(self, now: float) -> bytes:
        info = LeaseInfo(self.holder, self.kind, _HOST, os.getpid(), self._acquired_at, now + self.ttl)
        return json.dumps(asdict(info), sort_keys=True).encode()

    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeldError naming the live holder."""
        for _ in range(8):
            got = read_versioned(self.loc, LEASE_FILE)
            info = LeaseInfo.parse(got.data) if got.data is not None else None
            now = time.time()
            if info is not None and info.holder != self.holder and not info.expired(now):
                raise LeaseHeldError(
                    f"{self.loc.url} is being written by {info.describe()}; wait for it or stop it",
                    holder=info.holder,
                )
            self._acquired_at = now
            body = self._body(now)
            try:
                self._token = write_if(self.loc, LEASE_FILE, body, got.token)
            except WriteConflictError:
                continue  # someone else moved first: look again
            return
        raise LeaseHeldError(f"{self.loc.url}: the writer lease kept changing hands; try again", retryable=True)

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost`` set) when another writer took it meanwhile."""
        if self._token is None:
            return False
        try:
            self._token = write_if(self.loc, LEASE_FILE, self._body(time.time()), self._token)
        except WriteConflictError:
            holder = read_lease(self.loc)
            self.lost = f"lease taken over by {holder.describe() if holder else 'another writer'}"
            self._token = None
            return False
        return True

    def keep(self) -> None:
        """Renew every ttl/3 from a daemon thread until ``release``."""

        def run() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    if not self.renew():
                        return
                except StorageError:
                    continue  # a passing storage error: try again at the next tick, while the lease runs

        self._thread = start_named_thread(run, "ferry-lease")

    def release(self) -> None:
        """Give the lease up (an expired lease in its place), if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._token is None:
            return
        info = LeaseInfo(self.holder, self.kind, _HOST, os.getpid(), self._acquired_at, 0.0)
        with contextlib.suppress(WriteConflictError, StorageError):  # taken over or unreachable: it expires
            write_if(self.loc, LEASE_FILE, json.dumps(asdict(info), sort_keys=True).encode(), self._token)
        self._token = None

    def __enter__(self) -> Lease:
        self.acquire()
        self.keep()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
