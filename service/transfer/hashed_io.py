"""One shard copy's parameters and the one loop every copy path shares: read, throttle, hash, write.

Whatever the path (mmap of a local file, chunks from fsspec, a re-hash for verification), a piece
is throttled before it moves, hashed, written, and counted; the size and digest are checked once
at the end, before anything becomes visible under the final name. That final step is create-only
unless the copy is a repair (``CopySpec.create_only``): a path whose create finds the name taken
raises :class:`NameTaken`, and the caller looks at what stands there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from ferry.shard_tools.errors import Cancelled, ShardDigestError, ShardFormatError, SourceMissing
from ferry.shard_tools.format.digest import Hasher
from ferry.shard_tools.storage.store import Location

__all__ = [
    "CHUNK_SIZE",
    "PROGRESS_BYTES",
    "PROGRESS_SECONDS",
    "CopySpec",
    "NameTaken",
    "PacedMeter",
    "Throttle",
    "Progress",
    "check_cancel",
    "check_digest",
    "pump",
    "read_chunks",
]

CHUNK_SIZE = 8 * 1024 * 1024

Throttle = Callable[[int], None]
Progress = Callable[[int], None]
Buffer = bytes | bytearray | memoryview


#: a copy reports its progress at least every PROGRESS_BYTES or PROGRESS_SECONDS, whichever comes first
PROGRESS_BYTES = 1024 * 1024
PROGRESS_SECONDS = 0.25
_FIRST_STEP = 64 * 1024
_MIN_STEP = 16 * 1024


def noop(n: int) -> None:
    """The default throttle and progress callback."""


class PacedMeter:
    """Throttle and progress at a fine grain, whatever size the copy path moves its pieces in.

    ``throttle(n)`` admits ``n`` bytes in steps sized to pass in about a sixteenth to an eighth of
    PROGRESS_SECONDS (from 16 KiB under a tight limit up to PROGRESS_BYTES with none), and reports
    them to ``progress`` as they pass: at least every PROGRESS_BYTES or PROGRESS_SECONDS, so an
    8 MiB piece under a 256 KiB/s limit moves the transfer's bar and rate all along, not once at
    its end. Copy paths call it where they throttle; ``flush()`` reports what is left.
    """

    def __init__(self, throttle: Throttle, progress: Progress) -> None:
        self._throttle = throttle
        self._progress = progress
        self._step = _FIRST_STEP
        self._pending = 0
        self._last = time.monotonic()

    def throttle(self, n: int) -> None:
        while n > 0:
            step = min(n, self._step)
            start = time.monotonic()
            self._throttle(step)
            now = time.monotonic()
            took = now - start
            if took < PROGRESS_SECONDS / 16:
                self._step = min(self._step * 2, PROGRESS_BYTES)
            elif took > PROGRESS_SECONDS / 8:
                self._step = max(self._step // 2, _MIN_STEP)
            n -= step
            self._pending += step
            if self._pending >= PROGRESS_BYTES or now - self._last >= PROGRESS_SECONDS:
                self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self._pending:
            pending, self._pending = self._pending, 0
            self._progress(pending)
        self._last = time.monotonic() if now is None else now


class CopySpec(NamedTuple):
    """One shard copy's parameters, handed down the copy paths. ``create_only``: the verified shard gets
    its name only if no object has it (False only for a repair, which replaces a damaged object)."""

    path: str
    size: int
    digest: str
    chunk: int
    throttle: Throttle
    progress: Progress
    cancel: threading.Event | None
    create_only: bool = True


class NameTaken(Exception):
    """A copy path's create-only final step found an object at the shard's name (nothing was replaced).

    Not a FerryError: a signal to ``copy_shard``, which checks what stands there."""

    def __init__(self, target: str) -> None:
        super().__init__(f"{target} exists")
        self.target = target


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled()


def check_digest(hasher: Hasher, path: str, size: int, digest: str) -> None:
    """Raise unless ``hasher`` saw exactly ``size`` bytes hashing to ``digest``."""
    if hasher.nbytes != size:
        raise ShardFormatError(path, f"read {hasher.nbytes} bytes, manifest says {size} (truncated source?)")
    if hasher.hexdigest() != digest:
        raise ShardDigestError(path, "bytes read do not match the manifest digest (corrupt replica or transfer)")


def pump(
    pieces: Iterable[Buffer], c: CopySpec, write: Callable[[Buffer], object] | None = None, *, check: bool = True
) -> Hasher:
    """Throttle, hash, ``write`` and count each piece; then (``check``) check size and digest against ``c``."""
    hasher = Hasher()
    for piece in pieces:
        n = len(piece)
        c.throttle(n)
        hasher.update(piece)
        if write is not None:
            write(piece)
        c.progress(n)
    if check:
        check_digest(hasher, c.path, c.size, c.digest)
    return hasher


def read_chunks(src: Location, path: str, chunk: int, cancel: threading.Event | None) -> Iterator[bytes]:
    """``path`` under ``src`` in ``chunk``-sized reads through fsspec (SourceMissing when absent)."""
    try:
        f = src.fs.open(src.full(path), "rb", block_size=chunk, cache_type="none")
    except FileNotFoundError as exc:
        raise SourceMissing(str(exc)) from exc
    with f:
        while True:
            check_cancel(cancel)
            data = f.read(chunk)
            if not data:
                return
            yield data
