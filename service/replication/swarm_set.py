"""A filling cluster's verified set: the rows of a version's shard table it holds verified (and those it is
copying now), one small object beside the dataset, ``swarm/<version>.json``.

Peers filling the same version read it to pull those shards from this cluster before it publishes the
version. It is a hint and nothing more: every copy is verified against the digest of the manifest the
reader took from its own source, so a set that lies (stale, forged, a shard damaged since) costs a failed
attempt from that cluster, never a wrong byte. Readers of the dataset never look at ``swarm/``: a version
is visible only through ``manifest.json``. The filler deletes its sets when it publishes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.shard_tools.errors import ManifestError, StorageError
from ferry.shard_tools.storage.store import Location
from ferry.shard_tools.threadname import start_named_thread

__all__ = ["SWARM_DIR", "SWARM_FORMAT", "SwarmSet", "swarm_path", "read_swarm", "clear_swarm", "Advertiser"]

SWARM_DIR = "swarm"
SWARM_FORMAT = 1
_SLACK = 4096  # bytes of a set's object beyond its two bitmaps (keys, ids, time)


def swarm_path(version_id: str) -> str:
    """Where a cluster filling ``version_id`` keeps its verified set, relative to the dataset."""
    return f"{SWARM_DIR}/{version_id}.json"


def _pack(mask: np.ndarray) -> str:
    return base64.b64encode(np.packbits(mask).tobytes()).decode("ascii")


def _unpack(text: Any, shards: int, what: str) -> np.ndarray:
    if not isinstance(text, str):
        raise ManifestError(f"swarm set: {what} is not a string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ManifestError(f"swarm set: {what} is not base64") from exc
    if len(raw) != (shards + 7) // 8:
        raise ManifestError(f"swarm set: {what} holds {len(raw)} bytes, not {(shards + 7) // 8}")
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=shards).astype(bool)


@dataclass(frozen=True)
class SwarmSet:
    """Which rows of ``version_id``'s shard table (``table_digest``) a cluster holds verified, and which it is
    copying, as of ``updated_at`` (Unix time, the writer's clock)."""

    version_id: str
    table_digest: str
    verified: np.ndarray  # bool per row
    in_flight: np.ndarray  # bool per row
    updated_at: float

    def to_bytes(self) -> bytes:
        doc = {
            "format": SWARM_FORMAT, "version_id": self.version_id, "table_digest": self.table_digest,
            "shards": len(self.verified), "updated_at": self.updated_at,
            "verified": _pack(self.verified), "in_flight": _pack(self.in_flight),
        }  # fmt: skip
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, version_id: str, table_digest: str, shards: int) -> SwarmSet:
        """The set in ``data``, checked to be about this version and table with ``shards`` rows
        (ManifestError otherwise)."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"swarm set is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != SWARM_FORMAT:
            raise ManifestError("swarm set: not a format-1 object")
        if doc.get("version_id") != version_id or doc.get("table_digest") != table_digest:
            raise ManifestError("swarm set: another version or shard table")
        if doc.get("shards") != shards:
            raise ManifestError(f"swarm set: {doc.get('shards')!r} shards, not {shards}")
        at = doc.get("updated_at")
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not np.isfinite(at):
            raise ManifestError("swarm set: updated_at is not a number")
        verified = _unpack(doc.get("verified"), shards, "verified")
        in_flight = _unpack(doc.get("in_flight"), shards, "in_flight")
        return cls(version_id, table_digest, verified, in_flight & ~verified, float(at))


def read_swarm(loc: Location, version_id: str, table_digest: str, shards: int) -> SwarmSet | None:
    """The verified set a cluster publishes at ``loc`` for this version, or None (none there, unreadable, too
    large or not about this version: a peer's hint that does not check out is simply not taken)."""
    limit = 2 * ((shards + 7) // 8 * 4 // 3 + 4) + _SLACK
    try:
        with loc.fs.open(loc.full(swarm_path(version_id)), "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - any backend failure: no hint from this peer this time
        return None
    if len(data) > limit:
        return None
    try:
        return SwarmSet.from_bytes(data, version_id=version_id, table_digest=table_digest, shards=shards)
    except ManifestError:
        return None


def clear_swarm(loc: Location) -> None:
    """Delete every verified set at ``loc`` (its writer published, or moved on to another version)."""
    with contextlib.suppress(StorageError):
        for name in loc.listdir(SWARM_DIR):
            loc.remove(f"{SWARM_DIR}/{name}")


class Advertiser:
    """Keeps this cluster's verified set of one version up to date at ``loc``: written at once, then every
    ``interval`` seconds while it changed (and at least every ``heartbeat`` seconds, so peers can tell a live
    filler from a dead one), and a last time on close. Thread-safe."""

    def __init__(
        self, loc: Location, version_id: str, table_digest: str, verified: np.ndarray, *, interval: float,
        heartbeat: float, writable: Callable[[], bool] = lambda: True,
    ) -> None:  # fmt: skip
        """``writable()`` False: write nothing more (this writer lost the destination's lease)."""
        self.loc, self.version_id, self.table_digest = loc, version_id, table_digest
        self.interval, self.heartbeat, self.writable = interval, heartbeat, writable
        self._verified = verified.astype(bool, copy=True)
        self._in_flight = np.zeros(len(verified), dtype=bool)
        self._lock = threading.Lock()
        self._dirty = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0

    def __enter__(self) -> Advertiser:
        self.flush()
        self._thread = start_named_thread(self._loop, "ferry-swarm")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._in_flight[:] = False
            self._dirty = True
        self.flush()

    def started(self, row: int) -> None:
        with self._lock:
            self._in_flight[row] = True
            self._dirty = True

    def finished(self, row: int, ok: bool) -> None:
        with self._lock:
            self._in_flight[row] = False
            if ok:
                self._verified[row] = True
            self._dirty = True

    def flush(self) -> None:
        """Write the set now (a storage error is left for the next write: peers just see an older set)."""
        with self._lock:
            body = SwarmSet(self.version_id, self.table_digest, self._verified.copy(), self._in_flight.copy(),
                            time.time())  # fmt: skip
            self._dirty = False
        if not self.writable():
            return
        with contextlib.suppress(StorageError):
            self.loc.write_bytes(swarm_path(self.version_id), body.to_bytes())
            self.writes += 1

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval):
            if self._dirty or time.monotonic() - last >= self.heartbeat:
                self.flush()
                last = time.monotonic()
