"""One shard, one copy: pick the path for a (source, destination) pair; verify a stored shard.

Local → local goes through ``local_copy`` (kernel copy or mmap). Every other pair streams
fixed-size chunks through ``hashed_io.pump``. Destinations are written atomically: a temp name +
rename on local disks and on stores without buffered writers (memory), and on object stores a
streamed upload that is only completed (single PUT or multipart complete) when the digest
matched, and aborted otherwise. A local shard below SINGLE_PUT_MAX goes to S3 as one presigned
PUT (``s3_presigned``), its last chunk held back until the digest matched. Memory stays bounded
by one chunk per transfer, or per upload by SINGLE_PUT_MAX where the store's own single PUT is
used (s3fs sends a body it holds whole).
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ferry.shard_tools.errors import Cancelled, FerryError, SourceMissing
from ferry.shard_tools.store import Location, not_permitted, storage_error, temp_name

from . import object_store
from .hashed_io import CHUNK_SIZE, CopySpec, PacedMeter, Progress, Throttle, check_cancel, noop, pump, read_chunks
from .local_copy import copy_local, mapped_pieces
from .object_store import abort_stale_uploads, part_size, writes_buffered
from .s3_presigned import open_local_source, presign_allowed, put_presigned

__all__ = [
    "CHUNK_SIZE",
    "Cancelled",
    "SourceMissing",
    "CopyOutcome",
    "copy_shard",
    "verify_shard",
    "not_permitted",
    "storage_error",
    "abort_stale_uploads",
]


@dataclass(frozen=True)
class CopyOutcome:
    bytes: int
    seconds: float


def copy_shard(
    src: Location,
    dst: Location,
    path: str,
    size: int,
    digest: str,
    *,
    chunk_size: int = CHUNK_SIZE,
    throttle: Throttle = noop,
    progress: Progress = noop,
    cancel: threading.Event | None = None,
) -> CopyOutcome:
    """Copy ``path`` from ``src`` to ``dst``; it appears at ``dst`` only whole and verified.

    Raises ShardDigestError / ShardFormatError when the bytes read do not match (a retry or
    another replica may help), SourceMissing when the source lacks the shard,
    StorageError for backend failures, Cancelled when ``cancel`` is set.
    """
    t0 = time.monotonic()
    # every path throttles each piece before it moves: the meter splits that into small steps and
    # reports the bytes as they pass (the paths' own per-piece progress calls are then no-ops)
    meter = PacedMeter(throttle, progress)
    c = CopySpec(path, size, digest, chunk_size, meter.throttle, noop, cancel)
    try:
        if src.local and dst.local:
            copy_local(src.full(path), dst.full(path), c)
        else:
            _copy_stream(src, dst, c)
        meter.flush()
    except FerryError:
        raise
    except Exception as exc:  # noqa: BLE001 - map backend errors at the boundary
        raise storage_error(f"copy of {path} from {src.url} to {dst.url} failed: {exc}", exc) from exc
    return CopyOutcome(size, time.monotonic() - t0)


def _copy_stream(src: Location, dst: Location, c: CopySpec) -> None:
    target = dst.full(c.path)
    if dst.local:
        _write_then_rename(src, dst, c, target)
    elif writes_buffered(dst) and src.local and c.size < object_store.SINGLE_PUT_MAX:
        if presign_allowed(dst.fs) and put_presigned(src, dst, c):
            return
        # the store's own PUT of the very bytes hashed: read once into one buffer (no write-buffer copies)
        dst.fs.pipe_file(target, _read_local_verified(src, c))
    elif writes_buffered(dst):
        _upload(src, dst, c, target)
    else:
        _write_then_move(src, dst, c, target)


def _write_then_rename(src: Location, dst: Location, c: CopySpec, target: str) -> None:
    """To a local disk: a temp file beside the target, renamed once verified."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = temp_name(target)
    try:
        with open(tmp, "wb") as out:
            pump(read_chunks(src, c.path, c.chunk, c.cancel), c, out.write)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _upload(src: Location, dst: Location, c: CopySpec, target: str) -> None:
    """To an object store: the upload completes on close only; it is aborted on any failure."""
    f = dst.fs.open(target, "wb", block_size=part_size(c.size, c.chunk))
    try:
        pump(read_chunks(src, c.path, c.chunk, c.cancel), c, f.write)
    except BaseException:
        with contextlib.suppress(Exception):
            f.discard()
        f.closed = True  # never complete the upload
        raise
    f.close()


def _write_then_move(src: Location, dst: Location, c: CopySpec, target: str) -> None:
    """To other stores (memory…): a temp object, moved into place once verified."""
    tmp = temp_name(target)
    dst.fs.makedirs(dst.fs._parent(target), exist_ok=True)
    try:
        with dst.fs.open(tmp, "wb") as out:
            pump(read_chunks(src, c.path, c.chunk, c.cancel), c, out.write)
        dst.fs.mv(tmp, target)
    except BaseException:
        with contextlib.suppress(Exception):
            dst.fs.rm_file(tmp)
        raise


def _read_local_verified(src: Location, c: CopySpec) -> bytearray:
    """The whole (small) local shard in one buffer, hashed chunk by chunk as it is read."""
    with open_local_source(src, c) as f:
        buf = bytearray(c.size)
        view = memoryview(buf)
        try:
            pump(_read_into(f, view, c), c)
        finally:
            view.release()
    return buf


def _read_into(f: io.RawIOBase, view: memoryview, c: CopySpec) -> Iterator[memoryview]:
    """Fill ``view`` from ``f`` a chunk at a time, yielding each piece as it lands."""
    off = 0
    while off < c.size:
        check_cancel(c.cancel)
        n = f.readinto(view[off : min(off + c.chunk, c.size)])
        if not n:
            return
        piece = view[off : off + n]
        yield piece
        piece.release()
        off += n


def verify_shard(
    loc: Location,
    path: str,
    size: int,
    digest: str,
    *,
    chunk_size: int = CHUNK_SIZE,
    throttle: Throttle = noop,
    cancel: threading.Event | None = None,
) -> str | None:
    """Re-hash a stored shard; None when it matches, else the reason it does not."""
    c = CopySpec(path, size, digest, chunk_size, throttle, noop, cancel)
    try:
        if loc.local:
            full = loc.full(path)
            actual = os.path.getsize(full)
            if actual != size:
                return f"size is {actual} bytes, manifest says {size}"
            with open(full, "rb") as f:
                hasher = pump(mapped_pieces(f.fileno(), size, chunk_size, cancel), c, check=False)
        else:
            hasher = pump(read_chunks(loc, path, chunk_size, cancel), c, check=False)
    except (FileNotFoundError, SourceMissing):
        return "missing"
    except Cancelled:
        raise
    except Exception as exc:  # noqa: BLE001
        raise storage_error(f"cannot read {loc.url}/{path} to verify it: {exc}", exc) from exc
    if hasher.nbytes != size:
        return f"size is {hasher.nbytes} bytes, manifest says {size}"
    if hasher.hexdigest() != digest:
        return "digest mismatch"
    return None
