"""Fault injection for tests and drills: an fsspec filesystem wrapping another one.

``FaultyFileSystem(inner, read_fail=0.1, write_fail=0.1, flip=0.1)`` fails that fraction of
read and write calls with ``OSError(EIO)`` and flips one byte in that fraction of files
opened for reading (``injected`` counts read/write failures and ``flip_delivered``, the
corrupted bytes actually handed to a reader). It also counts every call by method name (``calls``) and records the
paths read whole (``reads``), which is how the tests prove that a no-op resync reads
nothing but the two manifests.
"""

from __future__ import annotations

import errno
import random
import threading
from collections import Counter
from typing import Any

from fsspec.spec import AbstractFileSystem

from ferry.shard_tools.storage.store import Location

__all__ = ["FaultyFileSystem", "faulty_location"]


class _Reader:
    def __init__(self, fs: FaultyFileSystem, inner: Any, flip: bool) -> None:
        self._fs, self._f, self._flip = fs, inner, flip

    def read(self, n: int = -1) -> bytes:
        self._fs._maybe_fail("read")
        data = self._f.read(n)
        if self._flip and data:
            self._flip = False
            pos = self._fs._rand(len(data))
            data = data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1 :]
            with self._fs._lock:
                self._fs.injected["flip_delivered"] += 1
        return bytes(data)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Writer:
    def __init__(self, fs: FaultyFileSystem, inner: Any) -> None:
        self._fs, self._f = fs, inner

    def write(self, data: bytes) -> int:
        self._fs._maybe_fail("write")
        return int(self._f.write(data) or len(data))

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class FaultyFileSystem(AbstractFileSystem):
    """Delegates to ``inner``, injecting failures and corruption, counting calls."""

    protocol = "faulty"
    cachable = False

    def __init__(
        self,
        inner: AbstractFileSystem,
        *,
        read_fail: float = 0.0,
        write_fail: float = 0.0,
        flip: float = 0.0,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.read_fail, self.write_fail, self.flip = read_fail, write_fail, flip
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.reads: list[str] = []
        self.injected: Counter[str] = Counter()

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()
            self.reads.clear()

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _rand(self, n: int) -> int:
        with self._lock:
            return self._rng.randrange(n)

    def _chance(self, p: float) -> bool:
        with self._lock:
            return p > 0 and self._rng.random() < p

    def _maybe_fail(self, kind: str) -> None:
        if self._chance(self.read_fail if kind == "read" else self.write_fail):
            with self._lock:
                self.injected[kind] += 1
            raise OSError(errno.EIO, f"injected {kind} failure")

    # reads
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kw: Any) -> bytes:
        self._count("cat_file")
        with self._lock:
            self.reads.append(path)
        self._maybe_fail("read")
        return bytes(self.inner.cat_file(path, start=start, end=end, **kw))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        self._count(f"open_{mode}")
        kwargs.pop("autocommit", None)
        kwargs.pop("cache_options", None)
        if "r" in mode:
            with self._lock:
                self.reads.append(path)
            flip = self._chance(self.flip)
            return _Reader(self, self.inner.open(path, mode, **kwargs), flip)
        kwargs.pop("block_size", None)
        self.inner.makedirs(self.inner._parent(path), exist_ok=True)  # a local inner needs the directory
        return _Writer(self, self.inner.open(path, mode))

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:  # no buffering layer of our own
        return self._open(self._strip_protocol(path), mode, **kwargs)

    # writes and metadata
    def pipe_file(self, path: str, value: bytes, **kw: Any) -> None:
        self._count("pipe_file")
        self._maybe_fail("write")
        self.inner.makedirs(self.inner._parent(path), exist_ok=True)
        self.inner.pipe_file(path, value, **kw)

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        self._count("ls")
        return self.inner.ls(path, detail=detail, **kw)

    def find(
        self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kw: Any
    ) -> Any:
        self._count("find")
        return self.inner.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kw)

    def info(self, path: str, **kw: Any) -> Any:
        self._count("info")
        return self.inner.info(path, **kw)

    def exists(self, path: str, **kw: Any) -> bool:
        self._count("exists")
        return bool(self.inner.exists(path, **kw))

    def size(self, path: str) -> int:
        self._count("size")
        return int(self.inner.size(path))

    def rm_file(self, path: str) -> None:
        self._count("rm_file")
        self.inner.rm_file(path)

    def mv(self, path1: str, path2: str, **kw: Any) -> None:
        self._count("mv")
        self.inner.mv(path1, path2, **kw)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.inner.makedirs(path, exist_ok=exist_ok)

    def mkdir(self, path: str, create_parents: bool = True, **kw: Any) -> None:
        self.inner.mkdir(path, create_parents=create_parents, **kw)


def faulty_location(loc: Location, **faults: Any) -> Location:
    """The same dataset root seen through a :class:`FaultyFileSystem`."""
    return Location(FaultyFileSystem(loc.fs, **faults), loc.root, f"faulty+{loc.url}")
