"""Local disk → local disk: in the kernel (``copy_file_range``) where it can, else through ``mmap``.

The kernel path hashes the destination's bytes as they landed; the mmap path writes the very
bytes it hashed. Either way the shard appears at its final name only whole and verified, and
(unless the copy is a repair) only where nothing has that name yet: :func:`place`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterator

from ferry.shard_tools.errors import ShardFormatError, SourceMissing
from ferry.shard_tools.format.digest import Hasher
from ferry.shard_tools.storage.store import link_new, temp_name

from .hashed_io import CopySpec, NameTaken, check_cancel, check_digest, pump

__all__ = ["copy_local", "mapped_pieces", "place"]

_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM}


def place(tmp: str, path: str, create_only: bool) -> None:
    """Give the verified temp file ``tmp`` the name ``path``: a hard link that fails if anything has the
    name (NameTaken then; ``create_only``), else a rename over it (a repair). The caller removes ``tmp``."""
    if not create_only:
        os.replace(tmp, path)
    elif not link_new(tmp, path):
        raise NameTaken(path)


def copy_local(src_path: str, dst_path: str, c: CopySpec) -> None:
    """Copy the shard at ``src_path`` to ``dst_path`` (temp name, verify, :func:`place`)."""
    path, size, digest = c.path, c.size, c.digest
    try:
        fd_in = os.open(src_path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise SourceMissing(str(exc)) from exc
    try:
        actual = os.fstat(fd_in).st_size
        if actual != size:
            raise ShardFormatError(path, f"source holds {actual} bytes, manifest says {size}")
        os.makedirs(os.path.dirname(dst_path), exist_ok=True)
        tmp = temp_name(dst_path)
        fd_out = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if _kernel_copy(fd_in, fd_out, c):
                check_digest(_hash_file(fd_out, c), path, size, digest)
            else:
                pump(mapped_pieces(fd_in, size, c.chunk, c.cancel), c, lambda piece: _write_all(fd_out, piece))
            os.close(fd_out)
            fd_out = -1
            place(tmp, dst_path, c.create_only)
        finally:
            if fd_out >= 0:
                os.close(fd_out)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    finally:
        os.close(fd_in)


def _kernel_copy(fd_in: int, fd_out: int, c: CopySpec) -> bool:
    """Copy with ``copy_file_range`` (page cache to page cache in the kernel, or a reflink); False when
    the kernel or filesystem pair cannot (nothing was written then).

    Preferred over the mmap + write loop, whose copy into freshly allocated page-cache pages is
    sometimes several times slower (docs/BENCHMARKS.md).
    """
    size, chunk, throttle, progress, cancel = c.size, c.chunk, c.throttle, c.progress, c.cancel
    copy = getattr(os, "copy_file_range", None)
    if copy is None or not size:
        return False
    off = 0
    while off < size:
        check_cancel(cancel)
        n = min(chunk, size - off)
        throttle(n)
        try:
            done = copy(fd_in, fd_out, n, off, off)
        except OSError as exc:
            if off == 0 and exc.errno in _NO_KERNEL_COPY:
                return False
            raise
        if not done:
            break  # the source is shorter than it was a moment ago: the size check after hashing says so
        progress(done)
        off += done
    return True


def _hash_file(fd: int, c: CopySpec) -> Hasher:
    """Hash the open file ``fd`` (what the destination now holds; its length is checked against ``c.size``)."""
    hasher = Hasher()
    for piece in mapped_pieces(fd, os.fstat(fd).st_size, c.chunk, c.cancel):
        hasher.update(piece)
    return hasher


def _write_all(fd: int, piece: bytes | bytearray | memoryview) -> None:
    done = 0
    while done < len(piece):
        done += os.write(fd, piece[done:])


def mapped_pieces(fd: int, length: int, chunk: int, cancel: threading.Event | None) -> Iterator[memoryview]:
    """``chunk``-sized views of a sequential read-only mapping of the first ``length`` bytes of ``fd``."""
    if not length:
        return
    mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    try:
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_SEQUENTIAL)
        for off in range(0, length, chunk):
            check_cancel(cancel)
            piece = view[off : off + chunk]
            yield piece
            piece.release()
    finally:
        view.release()
        with contextlib.suppress(BufferError):  # a consumer that failed mid-piece still holds it: gc closes the map
            mm.close()
