"""Stored bytes of remote shards that have reached this node before the shard is whole in its cache.

Two kinds of reads fetch a remote shard's bytes: frames read for the samples of a batch
(:class:`ferry.client.fetching.frames.FrameReader`) and the parts of the whole-shard fill that brings the shard
into the node cache (:meth:`ferry.client.fetching.replicas.Replicas.fetch_into`). Both start at once, in several
processes (DataLoader workers, ranks on the node), so without a shared record each frame read before the shard is
in the cache would cross the link twice: once as a frame, once inside its part. Here every such read is kept:

- ``<cache_dir>/arrived/<stored digest hex>.stored``: a sparse file, the shard's stored bytes at their offsets;
- ``<cache_dir>/arrived/<stored digest hex>.have``: fixed-size records ``(offset, length, check)`` appended after
  the bytes they name are written (``O_APPEND``: one record per write, whole), so a record never names bytes
  not yet written.

A fill holds ``<cache_dir>/.locks/<stored digest hex>.fill`` (``flock``) while it runs and records each span it
asks a replica for (a claim record) before asking. A frame read whose whole span has arrived is read from the
file, checked against the frame index's digests like any replica's answer; one whose span a live fill has
claimed waits for it (at most ``CLAIM_WAIT`` seconds, and not again for that shard once a wait ran out)
instead of fetching it again; any other is fetched and kept. A fill reads the arrived spans of each part from
the file and fetches only the rest, and the shard is checked against both manifest digests as it streams. So
a wrong byte in these files (a torn write, a file replaced under a reader) costs a read from a replica, never a
wrong sample. Everything here is best-effort: an ``OSError`` means "not arrived", and a write that fails is
skipped. The files go when the shard is whole in the cache, or when the cache evicts them (they count within
its limit).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ferry.shard_tools.format.manifest import ShardInfo

__all__ = ["ARRIVED", "ArrivedBytes", "pieces", "merge", "covers", "CLAIM_WAIT"]

ARRIVED = "arrived"
DATA_SUFFIX = ".stored"
HAVE_SUFFIX = ".have"
_RECORD = struct.Struct("<QQQ")
_MIX = 0x9E3779B97F4A7C15  # a record's check: a torn or foreign record does not name a span
_CLAIM = 0xC1A1  # mixed into a claim record's check
CLAIM_WAIT = 2.0  # seconds a frame read waits for a span a live fill has claimed (then it fetches the span)
_POLL = 0.005
_GRACE = 1.0  # seconds the bytes of a shard now whole stay for reads that began before it was
_HEX = re.compile(r"^[0-9a-f]{16,128}$")
_MAX_HAVE = 16 << 20  # records read at most (a larger file is not this module's: nothing has arrived)


def _check(offset: int, length: int, claim: bool = False) -> int:
    return ((offset * _MIX) ^ (length + _MIX + (_CLAIM if claim else 0))) & 0xFFFFFFFFFFFFFFFF


def covers(spans: Sequence[tuple[int, int]], a: int, b: int) -> bool:
    """Whether one of the merged ``spans`` holds all of ``[a, b)``."""
    return any(s <= a and b <= e for s, e in spans)


def merge(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching spans ``[a, b)`` joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def pieces(a: int, b: int, have: Sequence[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """``[a, b)`` cut into consecutive pieces ``(start, end, arrived)`` along the merged spans ``have``."""
    out: list[tuple[int, int, bool]] = []
    at = a
    for s, e in have:
        if e <= at:
            continue
        if s >= b:
            break
        if s > at:
            out.append((at, s, False))
            at = s
        end = min(e, b)
        out.append((at, end, True))
        at = end
        if at >= b:
            break
    if at < b:
        out.append((at, b, False))
    return out


class ArrivedBytes:
    """The arrived stored bytes of shards in one cache directory (see the module docstring); stateless between
    calls (every call opens the files by name), so safe to share between threads and to pickle."""

    def __init__(self, cache_dir: str) -> None:
        self.directory = os.path.join(cache_dir, ARRIVED)
        self._grown = 0  # bytes this process kept since it last asked the cache to evict
        self._stalled: set[str] = set()  # stored digests of shards whose fill let a wait run out here
        self._evict: Callable[[], None] | None = None
        self._every = 0

    def bound(self, evict: Callable[[], None], every: int) -> None:
        """Call ``evict`` (the cache's eviction, which counts these files within its limit) after every ``every``
        bytes this process keeps: a loader that reads only frames never fills a shard, the other moment the
        cache evicts."""
        self._evict, self._every = evict, max(1, every)

    @staticmethod
    def _name(info: ShardInfo) -> str | None:
        """The shard's stored digest in hex, the name of its files (None when it is not plain hex)."""
        name = info.stored_digest.rpartition(":")[2]
        return name if _HEX.match(name) else None

    def _files(self, info: ShardInfo) -> tuple[str, str] | None:
        name = self._name(info)
        if name is None:
            return None
        base = os.path.join(self.directory, name)
        return base + DATA_SUFFIX, base + HAVE_SUFFIX

    def spans(self, info: ShardInfo) -> list[tuple[int, int]]:
        """The merged spans of the shard's stored bytes that have arrived (none when nothing can be read)."""
        return self.state(info)[0]

    def state(self, info: ShardInfo) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The merged spans that have arrived, and those a fill has claimed (asked a replica for)."""
        files = self._files(info)
        if files is None:
            return [], []
        try:
            with open(files[1], "rb") as f:
                data = f.read(_MAX_HAVE + 1)
        except OSError:
            return [], []
        if len(data) > _MAX_HAVE:
            return [], []
        records = np.frombuffer(data, dtype="<u8", count=len(data) // _RECORD.size * 3).reshape(-1, 3)
        offset, length, check = records[:, 0], records[:, 1], records[:, 2]
        size = np.uint64(info.stored_bytes)
        valid = (length > 0) & (length <= size) & (offset <= size - np.minimum(length, size))
        mixed = offset * np.uint64(_MIX)  # wraps modulo 2**64, as _check's mask does
        kept = valid & (check == (mixed ^ (length + np.uint64(_MIX))))
        asked = valid & ~kept & (check == (mixed ^ (length + np.uint64(_MIX + _CLAIM))))

        def spans(which: np.ndarray) -> list[tuple[int, int]]:
            return merge(list(zip(offset[which].tolist(), (offset[which] + length[which]).tolist(), strict=True)))

        return spans(kept), spans(asked)

    def _fill_lock(self, info: ShardInfo) -> str | None:
        name = self._name(info)
        return None if name is None else os.path.join(os.path.dirname(self.directory), ".locks", name + ".fill")

    @contextlib.contextmanager
    def filling(self, info: ShardInfo) -> Iterator[None]:
        """Held by a fill of the shard while it runs: its claims count only meanwhile (nothing when the lock
        file cannot be made: the claims then never count)."""
        path = self._fill_lock(info)
        fd = -1
        if path is not None:
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError:
                    os.close(fd)
                    fd = -1
        try:
            yield
        finally:
            if fd >= 0:
                os.close(fd)

    def fill_live(self, info: ShardInfo) -> bool:
        """Whether a fill of the shard runs now, in any process of the node."""
        path = self._fill_lock(info)
        if path is None:
            return False
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def wait(self, info: ShardInfo, a: int, b: int, limit: float = CLAIM_WAIT) -> list[tuple[int, int]]:
        """The arrived spans once ``[a, b)`` has arrived, or at once when no live fill has claimed it (or after
        ``limit`` seconds: the caller then fetches it)."""
        have, claimed = self.state(info)
        if info.stored_digest in self._stalled or covers(have, a, b) or not covers(claimed, a, b):
            return have
        if not self.fill_live(info):
            return have
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:  # bounded by limit
            time.sleep(_POLL)
            have, _ = self.state(info)
            if covers(have, a, b) or not self.fill_live(info):
                return have
        # a fill that holds its lock and brings nothing (a frozen process, a hung read): this process waits for
        # that shard's fills no more
        self._stalled.add(info.stored_digest)
        return have

    def read(self, info: ShardInfo, a: int, b: int, have: Sequence[tuple[int, int]] | None = None) -> bytes | None:
        """Stored bytes ``[a, b)`` if all of them have arrived (``have``: :meth:`spans`, when already read)."""
        files = self._files(info)
        if files is None or not 0 <= a < b:
            return None
        if not covers(self.spans(info) if have is None else have, a, b):
            return None
        try:
            fd = os.open(files[0], os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.pread(fd, b - a, a)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) == b - a else None

    def keep(self, info: ShardInfo, offset: int, data: bytes | memoryview) -> None:
        """Record stored bytes read at ``offset`` (best-effort: a failure to write keeps nothing)."""
        files = self._files(info)
        length = min(len(data), info.stored_bytes - offset)
        if files is None or offset < 0 or length <= 0:
            return
        view = memoryview(data)[:length]
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(files[0], os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                done = 0
                while done < length:
                    done += os.pwrite(fd, view[done:], offset + done)
            finally:
                os.close(fd)
        except OSError:
            return
        self._record(files[1], offset, length, claim=False)
        self._grown += length  # unlocked: a race between threads costs one eviction more or less
        if self._evict is not None and self._grown >= self._every:
            self._grown = 0
            with contextlib.suppress(Exception):  # best-effort, as keeping is; the cache reports its own failures
                self._evict()

    def claim(self, info: ShardInfo, a: int, b: int) -> None:
        """Record that a fill asks a replica for ``[a, b)`` now (readers wait for it while the fill runs)."""
        files = self._files(info)
        b = min(b, info.stored_bytes)
        if files is not None and 0 <= a < b:
            with contextlib.suppress(OSError):
                os.makedirs(self.directory, exist_ok=True)
                self._record(files[1], a, b - a, claim=True)

    @staticmethod
    def _record(have: str, offset: int, length: int, *, claim: bool) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(have, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, _RECORD.pack(offset, length, _check(offset, length, claim)))
            finally:
                os.close(fd)

    def drop_soon(self, info: ShardInfo) -> None:
        """:meth:`drop` in ``_GRACE`` seconds: the shard is whole in the cache now, and frame reads that began
        before it was still find their bytes here (a process that ends before then leaves them to eviction)."""
        timer = threading.Timer(_GRACE, self.drop, (info,))
        timer.daemon = True
        timer.start()

    def drop(self, info: ShardInfo) -> None:
        """Remove what arrived of the shard (it is whole in the cache, or its bytes failed a check)."""
        files = self._files(info)
        for path in reversed(files or ()):  # the records first: none then names bytes that are gone
            with contextlib.suppress(OSError):
                os.unlink(path)

    def held(self) -> list[tuple[float, int, str]]:
        """``(mtime of the latest write, bytes on disk, name)`` per shard with arrived bytes (a sparse file's
        blocks count, not its length)."""
        found: dict[str, tuple[float, int]] = {}
        try:
            it = os.scandir(self.directory)
        except OSError:
            return []
        with it:
            for e in it:
                name, dot, suffix = e.name.rpartition(".")
                if not dot or "." + suffix not in (DATA_SUFFIX, HAVE_SUFFIX):
                    continue
                with contextlib.suppress(OSError):
                    st = e.stat()
                    mtime, size = found.get(name, (0.0, 0))
                    found[name] = (max(mtime, st.st_mtime), size + st.st_blocks * 512)
        return [(mtime, size, name) for name, (mtime, size) in found.items()]

    def remove(self, name: str) -> None:
        """Remove a shard's arrived bytes by the name :meth:`held` gave."""
        base = os.path.join(self.directory, name)
        for path in (base + HAVE_SUFFIX, base + DATA_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(path)
