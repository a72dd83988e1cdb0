"""The node-local shard cache: decompressed shards as files, shared by every process on a node.

Layout: ``<cache_dir>/<raw digest hex>.arrow`` (content-addressed, so versions and
replicas of a dataset share files), ``<cache_dir>/heads/<hex>.head`` (the first tokens of shards
seen), ``<cache_dir>/tables/<hex>.arrow`` (the shard tables of manifests, read once per node: see
:mod:`ferry.client.fetching.tables`), ``<cache_dir>/arrived/`` (stored bytes of remote shards not yet whole
here: see :mod:`ferry.client.fetching.arrived`) and ``<cache_dir>/.locks/<hex>.{fetch,use,table,fill}``.

- A shard is fetched whole from the first healthy replica, checked against the
  manifest, written to a temp name and renamed into place: a reader never sees a
  partial file under the final name.
- ``flock`` on ``.fetch`` makes one process download while the others wait and then
  find the file; ``flock(LOCK_SH)`` on ``.use`` is held for as long as a process has
  the shard mapped, and eviction takes ``LOCK_EX | LOCK_NB`` so it never removes a shard
  in use. Locks die with their process, so nothing leaks.
- ``limit`` bounds every byte of the directory: shards, heads, tables and downloads in progress. Beyond
  it heads over their share of the limit go first, then the least recently used shards (by
  mtime, touched on every open); see :meth:`ShardCache.evict`.
- A temp file of a download whose process is gone (killed, preempted) is removed by the next
  eviction; one of a live process is counted, never removed.
- A file of the wrong size, or whose raw digest fails (checked once per process, by
  the prefetch thread or on first open, when ``verify`` is on), is fetched again. A file a process
  wrote or checked gets a mark, ``.verified/<hex>``, that names the file as it was then (device,
  inode, size, modification time) and the digest's shape (frame size); it goes with the file.
  Another process (a DataLoader worker of the next epoch) takes a file its mark still names as
  checked instead of hashing it again; any change to the file (replaced, rewritten in place)
  changes what the mark would name, and the file is hashed again.
- An ``OSError`` on the cache's own files (full disk, read-only or vanished directory)
  becomes a ``CacheError`` that names the file: the dataset is fine, this node's disk is not.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from ferry.shard_tools.errors import CacheError, ShardError
from ferry.shard_tools.format.digest import raw_hasher
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.shard import ShardView, parse_shard
from ferry.shard_tools.libc import reserve_blocks
from ferry.shard_tools.storage.store import TEMP_MARKER, temp_is_stale, temp_name

from ..stats import COUNTERS
from .arrived import ArrivedBytes

if TYPE_CHECKING:  # replicas.py reads shard tables through this cache (tables.py)
    from .replicas import Replicas

__all__ = ["ShardCache", "Lease", "default_cache_dir", "flock_file", "TABLES"]

_SUFFIX = ".arrow"
TABLES = "tables"  # shard tables of manifests (see ferry.client.fetching.tables)
_HEADS = "heads"  # the first tokens of shards seen, for the sample of the shard before that runs on into one
_HEAD_SUFFIX = ".head"
_HEAD_CHECK = 16  # bytes of the blake2b digest after a head's tokens
_MARKS = ".verified"  # marks of files checked against their raw digest (see ShardCache._good)
_HEAD_SHARE = 8  # heads together keep at most this share of the limit, and each at most this share of its shard


def default_cache_dir() -> str:
    """``$FERRY_CACHE_DIR``, else ``$XDG_CACHE_HOME/ferry/shards`` (``~/.cache/ferry/shards``)."""
    env = os.environ.get("FERRY_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ferry", "shards")


def _cache_error(exc: OSError, path: str, doing: str) -> CacheError:
    """A one-line CacheError naming ``path`` for an OSError of a cache file."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        todo = "free space there or lower cache_limit"
    else:
        todo = "set cache_dir ($FERRY_CACHE_DIR) to a writable local directory"
    return CacheError(f"shard cache: cannot {doing} {path}: {exc.strerror or exc}; {todo}", path=path)


@contextlib.contextmanager
def _guard(path: str, doing: str, *, missing_ok: bool = False) -> Iterator[None]:
    """OSError → CacheError; with ``missing_ok`` a FileNotFoundError passes (the shard vanished: fetch again)."""
    try:
        yield
    except FileNotFoundError as exc:
        if missing_ok:
            raise
        raise _cache_error(exc, path, doing) from exc
    except OSError as exc:
        raise _cache_error(exc, path, doing) from exc


def _open_lock(path: str) -> int:
    with _guard(path, "open the lock file"):
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def flock_file(path: str, mode: int) -> Iterator[int]:
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def _map_shard(path: str, info: ShardInfo, dtype: str, populate: bool) -> ShardView:
    """Map a cached shard read-only. With ``populate`` its pages are pre-faulted (MAP_POPULATE where the OS
    has it): worth it when most of the shard will be read, as random sample reads then cost a memory copy
    and not a page fault each; wasteful when one sample is read from a shard among thousands."""
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    with _guard(path, "read", missing_ok=True):
        f = open(path, "rb")  # noqa: SIM115 — closed by the with below
    with f:
        try:
            mm = mmap.mmap(f.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise ShardError(info.path, f"cannot map cached copy {path}: {exc}") from exc
    return parse_shard(pa.py_buffer(mm), shard=info.path, dtype=dtype, documents=info.documents, tokens=info.tokens)


_SETTLE_NS = 50_000_000  # a marked file's time is set this far back: a write after the mark changes it


def _settled(path: str) -> str:
    """The file's stamp after setting its times a little into the past. File times come from a coarse clock:
    a write right after a mark could leave the time the mark names unchanged; a time set back cannot."""
    t = time.time_ns() - _SETTLE_NS
    try:
        os.utime(path, ns=(t, t))
    except OSError:
        return ""
    return _stamp(path)


def _stamp(path: str) -> str:
    """What names a file as it is now: device, inode, size and modification time (ns); "" when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def _file_digest(path: str, info: ShardInfo) -> str:
    """The raw digest of a cached file as ``info``'s row computes it (tree-shaped in stored format 3)."""
    hasher = raw_hasher(info.frame_size)
    with _guard(path, "read", missing_ok=True), open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


class Lease:
    """A mapped shard held open: its view and the shared ``use`` lock that protects it from eviction."""

    def __init__(self, view: ShardView, fd: int, nbytes: int) -> None:
        self.view = view
        self.nbytes = nbytes
        # a lease nobody released (its reader was dropped) still gives its lock file's descriptor back
        self._close = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        self._close()  # once: later calls do nothing


class ShardCache:
    """Decompressed shards of one or more datasets in a local directory, bounded by ``limit`` bytes."""

    def __init__(self, directory: str, limit: int, replicas: Replicas, *, dtype: str, verify: bool = True) -> None:
        self.directory = os.path.abspath(directory)
        self.limit = limit
        self.replicas = replicas
        self.dtype = dtype
        self.verify = verify
        self.fetches = 0  # shards this process downloaded (for tests and stats)
        self._count_lock = threading.Lock()
        self._verified: set[tuple[str, int]] = set()  # (raw digest, frame size) this process wrote or checked
        self._deferred: list[CacheError] = []  # node-cache failures of background fetches, raised by the reader
        self._here: set[tuple[int, str]] = set()  # (pid, raw digest): shards a thread of this process is fetching
        if replicas.arrived is not None:  # bytes kept there count within the limit
            replicas.arrived.bound(self.evict, max(16 << 10, min(8 << 20, limit // 8)))
        locks = os.path.join(self.directory, ".locks")
        with _guard(locks, "create the cache directory"):
            os.makedirs(locks, exist_ok=True)
            os.makedirs(os.path.join(self.directory, _MARKS), exist_ok=True)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        del state["_count_lock"]  # a lock does not pickle: each process makes its own
        state["_here"] = set()
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._count_lock = threading.Lock()

    def ensure_in_background(self, info: ShardInfo, *, wait: bool = True) -> bool:
        """:meth:`ensure` for a prefetch thread. A replica's failure resurfaces, with its real error, when the
        shard is opened; a failure of the node cache itself (a full disk, a broken directory) is kept for
        :meth:`raise_deferred`, since a shard read by frames may never be opened whole. ``wait`` False: False at
        once, fetching nothing, when another process (or thread) is fetching the shard."""
        try:
            return self.ensure(info, wait=wait)
        except CacheError as exc:
            self._deferred.append(exc)
        except Exception:  # noqa: BLE001
            pass
        return True

    def raise_deferred(self) -> None:
        """Raise the first node-cache failure of a background fetch, if one happened."""
        if self._deferred:
            raise self._deferred[0]

    def path(self, info: ShardInfo) -> str:
        return os.path.join(self.directory, info.raw_digest.split(":", 1)[1] + _SUFFIX)

    def _lock(self, info: ShardInfo, kind: str) -> str:
        return os.path.join(self.directory, ".locks", f"{info.raw_digest.split(':', 1)[1]}.{kind}")

    def present(self, info: ShardInfo) -> bool:
        """Whether the shard's file is in the cache at its full size (not yet checked against its digest)."""
        try:
            return os.stat(self.path(info)).st_size == info.raw_bytes
        except FileNotFoundError:
            return False

    def _good(self, info: ShardInfo) -> bool:
        """Present with the right size and, when verifying, its raw digest checked once by this process, or by
        another one while the file was as it is now (its mark names it)."""
        if not self.present(info):
            return False
        if not self.verify or (info.raw_digest, info.frame_size) in self._verified:
            return True
        path = self.path(info)
        stamp = _stamp(path)
        if stamp and self._read_mark(info) == f"{info.frame_size}:{stamp}":
            self._verified.add((info.raw_digest, info.frame_size))
            return True
        if _file_digest(path, info) == info.raw_digest:
            self._verified.add((info.raw_digest, info.frame_size))
            if stamp and int(stamp.rsplit(":", 1)[1]) < time.time_ns() - _SETTLE_NS:  # else a write may hide
                self._mark(info, stamp)  # as it was before it was hashed: a change meanwhile makes the mark stale
            return True
        return False

    def _mark_file(self, info: ShardInfo) -> str:
        return os.path.join(self.directory, _MARKS, info.raw_digest.split(":", 1)[1])

    def _read_mark(self, info: ShardInfo) -> str:
        try:
            with open(self._mark_file(info)) as f:
                return f.read(256)
        except OSError:
            return ""

    def _mark(self, info: ShardInfo, stamp: str) -> None:
        """Record that the cached file named by ``stamp`` matches its raw digest (no error when it cannot be
        written: other processes then hash the file themselves)."""
        if not stamp or not self.verify:
            return
        path = self._mark_file(info)
        tmp = temp_name(path)
        try:
            with open(tmp, "w") as f:
                f.write(f"{info.frame_size}:{stamp}")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _touch(self, info: ShardInfo, path: str) -> None:
        """Recency for LRU eviction across processes; the mark follows the file's new time when it named the
        file just before (so that the touch does not make other processes hash it again)."""
        before = _stamp(path)
        if before and self.verify and self._read_mark(info) == f"{info.frame_size}:{before}":
            after = _settled(path)
            if after:
                self._mark(info, after)
                return
        with _guard(path, "touch", missing_ok=True):
            os.utime(path)

    def ensure(self, info: ShardInfo, *, bad: bool = False, wait: bool = True) -> bool:
        """Make sure a good copy of the shard is in the cache (fetch it if not; ``bad``: replace it). ``wait``
        False: when another process or thread is fetching it, return False at once instead of waiting for it.

        Called from prefetch threads too, so digest checks of cached files mostly happen in the background.
        """
        if not bad and self._good(info):
            return True
        with contextlib.ExitStack() as stack:
            lock = self._lock(info, "fetch")
            try:
                stack.enter_context(flock_file(lock, fcntl.LOCK_EX | fcntl.LOCK_NB))
            except BlockingIOError:  # being fetched by another process or thread
                if not wait:
                    return False
                # another process's fetch: this one's prefetches leave it the link (this process's own fetches
                # are ranked by its pool already)
                here = (os.getpid(), info.raw_digest) in self._here
                with contextlib.nullcontext() if here else self.replicas.waiting_now():
                    stack.enter_context(flock_file(lock, fcntl.LOCK_EX))
            path = self.path(info)
            if not bad and self._good(info):
                return True  # another process fetched it while we waited
            self._verified.discard((info.raw_digest, info.frame_size))
            with _guard(path, "remove the stale copy"), contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # wrong size or digest; processes that mapped it keep their (checked) copy
            mine = (os.getpid(), info.raw_digest)
            self._here.add(mine)
            try:
                self._download(info, path)  # checked against both manifest digests as it streams
            finally:
                self._here.discard(mine)
            self._verified.add((info.raw_digest, info.frame_size))
            self._mark(info, _settled(path))
            with self._count_lock:  # prefetch threads fetch too: += is not atomic across threads
                self.fetches += 1
        self.evict(keep=path)
        return True

    def _download(self, info: ShardInfo, path: str) -> None:
        """Stream the shard into a temp name beside ``path``, then rename it into place."""
        tmp = temp_name(path)
        try:
            # an OSError here is the cache file's: a replica's failures arrive as ferry errors
            with _guard(path, "write"):
                with open(tmp, "wb+") as f:
                    reserve_blocks(f.fileno(), info.raw_bytes)  # the whole shard is written next
                    self.replicas.fetch_into(info, f)
                os.replace(tmp, path)
                if self.replicas.arrived is not None:
                    self.replicas.arrived.drop_soon(info)  # whole here now
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def open(self, info: ShardInfo, *, populate: bool = False) -> Lease:
        """Map a shard for reading (fetching it first if needed); release the lease when done."""
        for attempt in range(2):
            fd = _open_lock(self._lock(info, "use"))
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)  # from here on no process evicts it
                if attempt == 0:
                    COUNTERS.add("cache", "hits" if self.present(info) else "misses", 1)
                self.ensure(info, bad=attempt > 0)
                path = self.path(info)
                self._touch(info, path)
                return Lease(_map_shard(path, info, self.dtype, populate), fd, info.raw_bytes)
            except (ShardError, FileNotFoundError):
                os.close(fd)
                if attempt:
                    raise
            except BaseException:
                os.close(fd)
                raise
        raise AssertionError("unreachable")

    def _head_file(self, info: ShardInfo) -> str:
        return os.path.join(self._heads_dir(), os.path.basename(self.path(info))[: -len(_SUFFIX)] + _HEAD_SUFFIX)

    @staticmethod
    def _head_digest(info: ShardInfo, body: bytes) -> bytes:
        return hashlib.blake2b(body, digest_size=_HEAD_CHECK, key=info.raw_digest.encode()[:64]).digest()

    def has_head(self, info: ShardInfo, nbytes: int) -> bool:
        """Whether a head of at least ``nbytes`` raw bytes of the shard is kept (see :meth:`keep_head`)."""
        try:
            return os.stat(self._head_file(info)).st_size >= nbytes + _HEAD_CHECK
        except OSError:
            return False

    def keep_head(self, info: ShardInfo, head: bytes) -> None:
        """Keep the first raw bytes of a verified shard beside the cache, with a digest bound to the shard.

        The last sample of a shard runs on into the next one; format 1 can read that head only by fetching
        the next shard whole. A kept head serves it instead, after the shard itself was evicted. Heads are
        (seq_len + 1) tokens per shard seen (4 KiB for 2048 uint16 tokens), counted in the cache's limit and
        evicted under it (see :meth:`evict`). A head larger than ``1/_HEAD_SHARE`` of its shard is not kept
        (the shard itself serves as well), nor one larger than the heads' share of the limit; a head that
        cannot be written is no error (the shard is then fetched)."""
        nbytes = len(head) + _HEAD_CHECK
        if nbytes > info.raw_bytes // _HEAD_SHARE or nbytes > self.limit // _HEAD_SHARE:
            return
        if self.read_head(info, len(head)) is not None:
            return  # kept and intact (a damaged one was removed: written again here)
        path = self._head_file(info)
        tmp = temp_name(path)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(head + self._head_digest(info, head))
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        with contextlib.suppress(CacheError):
            self.evict()  # a failure of the cache directory itself is raised by the next fetch

    def read_head(self, info: ShardInfo, nbytes: int) -> bytes | None:
        """The first ``nbytes`` raw bytes of the shard from its kept head, checked; None when there is none, it
        is shorter, or it does not match its digest (then it is removed)."""
        path = self._head_file(info)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        body, digest = data[:-_HEAD_CHECK], data[-_HEAD_CHECK:]
        if len(data) > _HEAD_CHECK and self._head_digest(info, body) == digest:
            if len(body) < nbytes:
                return None
            with contextlib.suppress(OSError):
                os.utime(path)  # recency, for eviction
            return body[:nbytes]
        with contextlib.suppress(OSError):
            os.unlink(path)  # damaged: the shard is fetched whole, and its head kept again
        return None

    def _heads_dir(self) -> str:
        return os.path.join(self.directory, _HEADS)

    def _scan(self, directory: str, suffix: str) -> tuple[list[tuple[float, int, str]], int]:
        """(mtime, size, path) of the files of ``directory`` ending in ``suffix``, and the bytes of the temp
        files of downloads in progress there. A temp file whose writer on this host is gone (a killed or
        preempted process) is removed, as is one of an unknown writer left unchanged for a long time."""
        out: list[tuple[float, int, str]] = []
        pending = 0
        now = time.time()
        try:
            it = os.scandir(directory)
        except FileNotFoundError:
            if directory == self.directory:
                raise _cache_error(FileNotFoundError(errno.ENOENT, "no such directory"), directory, "list") from None
            return out, pending  # no heads kept yet
        except OSError as exc:
            raise _cache_error(exc, directory, "list") from exc
        with it:
            for e in it:
                with contextlib.suppress(FileNotFoundError):
                    if TEMP_MARKER in e.name:
                        st = e.stat()
                        if temp_is_stale(e.name, now - st.st_mtime):
                            os.unlink(e.path)
                        else:
                            # on the disk too: counted, never evicted; its blocks may be reserved beyond its size
                            pending += max(st.st_size, st.st_blocks * 512)
                    elif e.name.endswith(suffix):
                        st = e.stat()
                        out.append((st.st_mtime, st.st_size, e.path))
        return out, pending

    def usage(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every cached shard file; removes temp files left by crashed processes."""
        return self._scan(self.directory, _SUFFIX)[0]

    def disk_bytes(self) -> int:
        """Bytes of the cache's files: shards, kept heads, shard tables and downloads in progress (what ``limit``
        bounds)."""
        shards, pending = self._scan(self.directory, _SUFFIX)
        heads, head_pending = self._scan(self._heads_dir(), _HEAD_SUFFIX)
        arrived = sum(size for _, size, _ in ArrivedBytes(self.directory).held())
        return pending + head_pending + arrived + self._table_bytes() + sum(size for _, size, _ in shards + heads)

    def _table_bytes(self) -> int:
        """Bytes of the shard tables kept beside the shards (and their downloads in progress): counted in the
        limit, never evicted here (see :mod:`ferry.client.fetching.tables`, which keeps the last few)."""
        tables, pending = self._scan(os.path.join(self.directory, TABLES), _SUFFIX)
        return pending + sum(size for _, size, _ in tables)

    def evict(self, keep: str | None = None) -> None:
        """Remove files until the cache fits ``limit``: shards, heads, shard tables, downloads in progress and
        bytes arrived by frames (:mod:`ferry.client.fetching.arrived`) together (tables count but are not removed
        here: the few kept are those of the versions read last).

        Heads first beyond their share of the limit (``1/_HEAD_SHARE``), oldest first; then arrived bytes, oldest
        first (a fill that loses them reads those spans from a replica); then shards, least recently used first
        (never one in use, nor ``keep``). Heads within their share stay when shards in
        use hold the cache over the limit: that excess ends when those shards are released and evicted,
        while a head removed for it is gone for the rest of the process (it is kept once per shard seen)."""
        shards, pending = self._scan(self.directory, _SUFFIX)
        heads, head_pending = self._scan(self._heads_dir(), _HEAD_SUFFIX)
        heads.sort()
        head_bytes = sum(size for _, size, _ in heads)
        arrived = ArrivedBytes(self.directory)
        partial = sorted(arrived.held())
        total = pending + head_pending + head_bytes + self._table_bytes() + sum(size for _, size, _ in shards)
        total += sum(size for _, size, _ in partial)
        while heads and head_bytes > self.limit // _HEAD_SHARE:
            _, size, path = heads.pop(0)
            self._remove(path)
            head_bytes -= size
            total -= size
        for _, size, name in partial:
            if total <= self.limit:
                return
            arrived.remove(name)
            total -= size
        for _, size, path in sorted(shards):
            if total <= self.limit:
                return
            if path != keep and self._evict_shard(path):
                total -= size

    def _remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _cache_error(exc, path, "evict") from exc

    def _evict_shard(self, path: str) -> bool:
        """Remove a cached shard unless a process has it mapped (holds its ``use`` lock): whether it went."""
        name = os.path.basename(path)[: -len(_SUFFIX)]
        fd = _open_lock(os.path.join(self.directory, ".locks", f"{name}.use"))
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # mapped by some process right now
            self._remove(path)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, _MARKS, name))
            return True
        finally:
            os.close(fd)
