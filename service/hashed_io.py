"""One shard copy's parameters and the one loop every copy path shares: read, throttle, hash, write.

Whatever the path (mmap of a local file, chunks from fsspec, a re-hash for verification), a piece
is throttled before it moves, hashed, written, and counted; the size and digest are checked once
at the end, before anything becomes visible under the final name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from shard_tools.digest import Hasher
from shard_tools.errors import Cancelled, ShardDigestError, ShardFormatError, SourceMissing
from shard_tools.store import Location

__all__ = ["CHUNK_SIZE", "CopySpec", "Throttle", "Progress", "check_cancel", "check_digest", "pump", "read_chunks"]

CHUNK_SIZE = 8 * 1024 * 1024

Throttle = Callable[[int], None]
Progress = Callable[[int], None]
Buffer = bytes | bytearray | memoryview


def noop(n: int) -> None:
    """The default throttle and progress callback."""


class CopySpec(NamedTuple):
    """One shard copy's parameters, handed down the copy paths."""

    path: str
    size: int
    digest: str
    chunk: int
    throttle: Throttle
    progress: Progress
    cancel: threading.Event | None


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
