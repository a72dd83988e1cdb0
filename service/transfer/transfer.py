"""One shard, one copy: pick the path for a (source, destination) pair; verify a stored shard.

Local → local goes through ``local_copy`` (kernel copy or mmap). Every other pair streams
fixed-size chunks through ``hashed_io.pump``. Destinations are written atomically: a temp name +
hard link on local disks, a temp object moved into place on stores without buffered writers
(memory). To an object store a shard below SINGLE_PUT_MAX goes as one PUT, sent only once its
bytes matched the digest: a local one to S3 as a presigned PUT (``s3_presigned``, its last chunk
held back until then), else the store's own PUT of a buffer hashed as it filled. A larger shard
goes as a streamed upload that is only completed (multipart complete) when the digest matched,
and aborted otherwise. Memory stays bounded by one chunk per transfer, or per upload by
SINGLE_PUT_MAX where the store's own single PUT is used (s3fs sends a body it holds whole).

The final step is create-only (a link that fails on a taken name; S3 ``If-None-Match: *`` on the
PUT or the multipart complete; GCS ``ifGenerationMatch=0``; Azure ``If-None-Match: *``): a shard
object another writer stored at the name meanwhile is never replaced. When the name was taken,
the object there decides: the very bytes wanted count as copied, anything else is a
WriteConflictError. Only a repair (``create_only=False``) replaces what stands at the name.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ferry.shard_tools.errors import Cancelled, FerryError, SourceMissing, StorageError, WriteConflictError
from ferry.shard_tools.storage.store import Location, not_permitted, storage_error, temp_name

from . import object_store
from .hashed_io import (
    CHUNK_SIZE,
    CopySpec,
    NameTaken,
    PacedMeter,
    Progress,
    Throttle,
    check_cancel,
    noop,
    pump,
    read_chunks,
)
from .local_copy import copy_local, mapped_pieces, place
from .object_store import abort_stale_uploads, create_refused, part_size, writes_buffered
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
    create_only: bool = True,
) -> CopyOutcome:
    """Copy ``path`` from ``src`` to ``dst``; it appears at ``dst`` only whole and verified, and (``create_only``)
    only where no object has the name: one stored there meanwhile with the very bytes counts as copied.

    Raises ShardDigestError / ShardFormatError when the bytes read do not match (a retry or
    another replica may help), SourceMissing when the source lacks the shard, WriteConflictError
    (not retryable) when another object holds the name, StorageError for backend failures,
    Cancelled when ``cancel`` is set. ``create_only=False`` (a repair) replaces what is there.
    """
    t0 = time.monotonic()
    # every path throttles each piece before it moves: the meter splits that into small steps and
    # reports the bytes as they pass (the paths' own per-piece progress calls are then no-ops)
    meter = PacedMeter(throttle, progress)
    c = CopySpec(path, size, digest, chunk_size, meter.throttle, noop, cancel, create_only)
    try:
        try:
            if src.local and dst.local:
                copy_local(src.full(path), dst.full(path), c)
            else:
                _copy_stream(src, dst, c)
        except NameTaken:
            _settle(dst, c)
        meter.flush()
    except FerryError:
        raise
    except Exception as exc:  # noqa: BLE001 - map backend errors at the boundary
        raise storage_error(f"copy of {path} from {src.url} to {dst.url} failed: {exc}", exc) from exc
    return CopyOutcome(size, time.monotonic() - t0)


def _settle(dst: Location, c: CopySpec) -> None:
    """The create-only final step found ``c.path`` taken at ``dst``: return when the object there is the very
    shard wanted (another writer stored the same bytes), else raise; nothing is replaced either way."""
    where = f"{dst.url}/{c.path}"
    odd = _not_a_file(dst.full(c.path)) if dst.local else None
    if odd is not None:
        raise WriteConflictError(f"{where} is {odd}, not a shard object; ferry never replaces what stands at a "
                                 "shard's name: remove it there, then retry")  # fmt: skip
    problem = verify_shard(dst, c.path, c.size, c.digest, chunk_size=c.chunk, cancel=c.cancel)
    if problem is None:
        return
    if problem == "missing":
        raise StorageError(f"{where}: another writer's object held the name (or was being created) at the copy's "
                           "final step and vanished since; nothing was stored (a retry copies it)")  # fmt: skip
    raise WriteConflictError(
        f"{where}: another writer stored other bytes at this shard's name while it was being copied ({problem}); "
        "ferry never replaces a stored shard object, which a published version may name: delete it there if "
        "no version names it, then retry"
    )


def _not_a_file(full: str) -> str | None:
    """What stands at a local name when it is not a regular file (a directory, a symbolic link…), else None."""
    try:
        mode = os.lstat(full).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a directory" if stat.S_ISDIR(mode) else "a special file"


def _copy_stream(src: Location, dst: Location, c: CopySpec) -> None:
    target = dst.full(c.path)
    if dst.local:
        _write_then_place(src, c, target)
    elif writes_buffered(dst) and c.size < object_store.SINGLE_PUT_MAX:
        if src.local and presign_allowed(dst.fs) and put_presigned(src, dst, c):
            return
        # the store's own PUT of the very bytes hashed: read once into one buffer (no write-buffer copies);
        # one request, on which every store checks a create-only condition (fake-gcs-server ignores it
        # on a resumable upload)
        data = _put_body(dst, _read_local_verified(src, c) if src.local else _read_verified(src, c))
        _final(dst, target, lambda: dst.fs.pipe_file(target, data, mode="create" if c.create_only else "overwrite"))
    elif writes_buffered(dst):
        _upload(src, dst, c, target)
    else:
        _write_then_move(src, dst, c, target)


def _put_body(dst: Location, data: bytearray) -> bytes | bytearray:
    """``data`` as the store's PUT takes it: azure-storage-blob reads a bytearray as an iterable of ints
    (and fails), so Azure Blob gets a bytes copy; s3fs and gcsfs send the buffer itself."""
    protocols = dst.fs.protocol if isinstance(dst.fs.protocol, tuple) else (dst.fs.protocol,)
    return bytes(data) if any(p in ("az", "abfs", "abfss") for p in protocols) else data


def _final(dst: Location, target: str, step: Callable[[], object]) -> None:
    """Run an object store's final ``step`` (a PUT, a multipart complete): NameTaken when the store refused
    its create-only condition because an object has the name."""
    try:
        step()
    except Exception as exc:
        if create_refused(exc):
            raise NameTaken(target) from exc
        raise
    finally:
        dst.fs.invalidate_cache(target)


def _write_then_place(src: Location, c: CopySpec, target: str) -> None:
    """To a local disk: a temp file beside the target, given its name once verified (``local_copy.place``)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = temp_name(target)
    try:
        with open(tmp, "wb") as out:
            pump(read_chunks(src, c.path, c.chunk, c.cancel), c, out.write)
        place(tmp, target, c.create_only)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _upload(src: Location, dst: Location, c: CopySpec, target: str) -> None:
    """To an object store: the upload completes on close only (create-only: ``xb``, the store's own
    condition on the PUT or the multipart complete); it is aborted on any failure."""
    f = dst.fs.open(target, "xb" if c.create_only else "wb", block_size=part_size(c.size, c.chunk))
    try:
        pump(read_chunks(src, c.path, c.chunk, c.cancel), c, f.write)
    except BaseException:
        with contextlib.suppress(Exception):
            f.discard()
        f.closed = True  # never complete the upload
        raise
    try:
        _final(dst, target, f.close)
    except BaseException:
        with contextlib.suppress(Exception):
            f.discard()  # a multipart upload whose complete was refused: its parts go
        raise


_MOVE_LOCK = threading.Lock()


def _write_then_move(src: Location, dst: Location, c: CopySpec, target: str) -> None:
    """To other stores (memory…): a temp object, moved into place once verified; create-only, the move
    happens only where no object has the name (checked under one lock: memory:// lives in this process;
    on another store without a create-only write two writers racing may both write)."""
    tmp = temp_name(target)
    dst.fs.makedirs(dst.fs._parent(target), exist_ok=True)
    try:
        with dst.fs.open(tmp, "wb") as out:
            pump(read_chunks(src, c.path, c.chunk, c.cancel), c, out.write)
        with _MOVE_LOCK:
            if c.create_only and dst.fs.exists(target):
                raise NameTaken(target)
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


def _read_verified(src: Location, c: CopySpec) -> bytearray:
    """The whole (small) shard from a store in one buffer, hashed chunk by chunk as it is read."""
    buf = bytearray(c.size)
    at = [0]

    def write(piece: bytes | bytearray | memoryview) -> None:
        n = min(len(piece), c.size - at[0])  # a longer source fails pump's size check after the last piece
        buf[at[0] : at[0] + n] = piece[:n]
        at[0] += n

    pump(read_chunks(src, c.path, c.chunk, c.cancel), c, write)
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
