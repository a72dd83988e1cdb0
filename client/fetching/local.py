"""Reads of a dataset's only replica, a local disk, in the calling thread.

The replica race (:func:`ferry.client.fetching.fetch.race`) runs each read on a pool thread with a deadline, so
that a replica that hangs gives way to another, or ends in an error in bounded time. For a dataset with one
replica on a local disk it has nothing to give: no other replica to hedge to, and no wait to bound; its hand-offs
between threads then cost more than the read. A network mount (NFS, Lustre, GPFS, CephFS, FUSE, ...) can hang
like any network, so it keeps the race: only the filesystem types of :data:`DISK_FILESYSTEMS` are read directly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections import OrderedDict
from collections.abc import Callable

from ferry.shard_tools.errors import ShardFormatError, StorageError
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.storage.store import Location

__all__ = ["DISK_FILESYSTEMS", "LocalRanges", "on_local_disk", "mount_type", "open_regular"]

#: Linux filesystem types of block devices or memory: a read of them waits on no network.
DISK_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "tmpfs", "ramfs", "overlay"}
)
_MOUNTINFO = "/proc/self/mountinfo"


def mount_type(path: str, mountinfo: str) -> str | None:
    """The filesystem type of the mount that holds absolute ``path`` (its longest mount point), from the text
    of a ``/proc/<pid>/mountinfo``; None when no line covers it."""
    best, kind = -1, None
    for line in mountinfo.splitlines():
        fields, sep, rest = line.partition(" - ")
        parts, after = fields.split(), rest.split()
        if not sep or len(parts) < 5 or not after:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])  # spaces are \040
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), after[0]
    return kind


def on_local_disk(path: str) -> bool:
    """Whether ``path`` lies on a filesystem of :data:`DISK_FILESYSTEMS` (False where the mount table cannot be
    read: not Linux, or a sandbox without ``/proc``)."""
    try:
        with open(_MOUNTINFO) as f:
            table = f.read()
    except OSError:
        return False
    return mount_type(os.path.realpath(path), table) in DISK_FILESYSTEMS


def open_regular(path: str, shard: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file: a FIFO, device or directory in a
    shard's place is a ShardFormatError, and is refused without waiting (opening a FIFO for reading waits for a
    writer, for ever). An OSError when it cannot be opened (FileNotFoundError: it is missing)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ShardFormatError(shard, "is not a regular file (a FIFO, device or directory stands in its place)")
    os.set_blocking(fd, True)
    return fd


class LocalRanges:
    """``read_range`` of a dataset whose only replica is on a local disk: ``os.pread`` on a handle kept per
    shard, in the calling thread (one thread: the handles are not shared). A replica race (its pool, deadlines
    and hedging) buys nothing where there is no other replica and a read costs no wait, and its hand-offs between
    threads cost about as much as decoding a small image or a frame."""

    def __init__(self, loc: Location, kept: int = 64) -> None:
        self.loc, self.kept = loc, kept
        self._fds: OrderedDict[str, int] = OrderedDict()

    def __call__(
        self, info: ShardInfo, offset: int, length: int, *, check: Callable[[bytes], None] | None = None
    ) -> bytes:
        fd = self._fds.get(info.path)
        if fd is None:
            fd = self._open(info.path)
            self._fds[info.path] = fd
            while len(self._fds) > self.kept:
                os.close(self._fds.popitem(last=False)[1])
        else:
            self._fds.move_to_end(info.path)
        try:
            data = os.pread(fd, length, offset)
        except OSError as exc:
            raise StorageError(f"cannot read bytes [{offset}, {offset + length}) of {info.path}: {exc}") from exc
        if check is not None and len(data) == length:  # a short read is the frame reader's to report
            check(data)
        return data

    def _open(self, rel: str) -> int:
        """A handle of shard ``rel`` (FileNotFoundError: the shard is missing). When the process is out of
        descriptors (many datasets each keeping handles), this reader's kept handles are closed first."""
        for attempt in range(2):
            try:
                return open_regular(self.loc.full(rel), rel)
            except FileNotFoundError:
                raise
            except OSError as exc:
                if attempt or exc.errno != errno.EMFILE or not self._fds:
                    raise StorageError(f"cannot open {rel}: {exc}") from exc
                self.close()
        raise AssertionError("unreachable")

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            self.close()
