"""The bytes a line-oriented unit owns: a whole (possibly compressed) file, a newline-aligned
byte range, or the lines of a run of zstd frames.

Frames need not end at a newline, so a frame unit owns the lines that *follow a newline inside
its frames* (the first unit also owns the file's first line): its reader skips the partial line
it starts in, and reads on past its last frame to finish the line it ends in. Each line then
belongs to exactly one unit, and the units' bytes, concatenated, are the file's.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Protocol, cast

import fsspec
import zstandard

from ..errors import InputFormatError
from .base import SourceOptions, Unit

__all__ = ["Readable", "open_unit", "open_part", "lines_before", "is_part"]

_CHUNK = 1 << 20


def is_part(unit: Unit) -> bool:
    """Whether ``unit`` is a byte range or frame run of a file, not the whole of it."""
    return unit.stop is not None and unit.span in ("bytes", "zstd_frames")


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


@contextmanager
def open_unit(unit: Unit, options: SourceOptions) -> Iterator[Readable]:
    """A binary stream of the (decompressed) bytes ``unit`` owns."""
    if not is_part(unit):
        with fsspec.open(unit.path, "rb", compression="infer", **(options.storage_options or {})) as f:
            yield f
        return
    with open_part(unit, options) as part:
        yield part


@contextmanager
def open_part(unit: Unit, options: SourceOptions) -> Iterator[io.RawIOBase]:
    """The bytes a byte-range or frame unit owns (see :func:`is_part`)."""
    assert is_part(unit) and unit.stop is not None
    with fsspec.open(unit.path, "rb", **(options.storage_options or {})) as raw:
        if unit.span == "bytes":
            raw.seek(unit.start)
            yield _Window(raw, unit.stop - unit.start, unit.path)
        else:
            yield _Chunks(_frame_lines(raw, unit, _size(raw)))


def lines_before(unit: Unit, options: SourceOptions, *, universal: bool = False) -> int:
    """How many lines of the file come before the first line ``unit`` owns (for error messages
    and row numbers: it reads the file up to the unit). ``universal`` counts lines as text mode
    splits them, a lone ``\r`` ending one too; else only ``\n`` ends a line."""
    if not is_part(unit) or unit.start == 0:
        return 0
    assert unit.stop is not None
    count = _LineCount(universal)
    with fsspec.open(unit.path, "rb", **(options.storage_options or {})) as raw:
        if unit.span == "bytes":
            count.feed_all(_Window(raw, unit.start, unit.path))
            return count.total
        count.feed_all(_decompressed(raw, 0, unit.start, unit.path))
        with _decompressed(raw, unit.start, unit.stop, unit.path) as frames:
            while chunk := frames.read(_CHUNK):  # the partial line the unit skips, to its first newline
                end = chunk.find(b"\n")
                count.feed(chunk if end < 0 else chunk[: end + 1])
                if end >= 0:
                    break
    return count.total


class _LineCount:
    """Line ends in a stream of blocks (a ``\r\n`` split across two blocks counts once)."""

    def __init__(self, universal: bool) -> None:
        self.universal, self.total, self._cr = universal, 0, False

    def feed(self, block: bytes) -> None:
        self.total += block.count(b"\n")
        if self.universal and block:
            pairs = block.count(b"\r\n") + int(self._cr and block[:1] == b"\n")
            self.total += block.count(b"\r") - pairs
            self._cr = block.endswith(b"\r")

    def feed_all(self, source: Readable) -> None:
        while block := source.read(_CHUNK):
            self.feed(block)


def _size(f: Any) -> int:
    pos = f.tell()
    end = int(f.seek(0, io.SEEK_END))
    f.seek(pos)
    return end


def _decompressed(raw: Any, start: int, stop: int, path: str) -> Any:
    """A reader of the frames in compressed bytes ``[start, stop)``."""
    raw.seek(start)
    dctx = zstandard.ZstdDecompressor()
    window = cast(IO[bytes], _Window(raw, stop - start, path))
    return dctx.stream_reader(window, read_across_frames=True, closefd=False)


def _frame_lines(raw: Any, unit: Unit, size: int) -> Iterator[bytes]:
    """The decompressed bytes a frame unit owns (see the module docstring)."""
    assert unit.stop is not None
    skipping = unit.start > 0
    with _decompressed(raw, unit.start, unit.stop, unit.path) as frames:
        while chunk := frames.read(_CHUNK):
            if skipping:
                i = chunk.find(b"\n")
                if i < 0:
                    continue
                chunk, skipping = chunk[i + 1 :], False
            if chunk:
                yield chunk
    if skipping or unit.stop >= size:
        return  # no newline in these frames: all of their bytes belong to an earlier unit's line
    with _decompressed(raw, unit.stop, size, unit.path) as rest:
        while chunk := rest.read(_CHUNK):
            i = chunk.find(b"\n")
            if i >= 0:
                yield chunk[: i + 1]
                return
            yield chunk


class _Window(io.RawIOBase):
    """Exactly ``length`` bytes from the current position of ``f``; a file that ends sooner
    changed since the pack was planned."""

    def __init__(self, f: Any, length: int, path: str) -> None:
        super().__init__()
        self._f, self._left, self._path = f, length, path

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if size is None or size < 0 else min(size, self._left)
        data = self._f.read(n)
        if not data:
            raise InputFormatError(
                f"{self._path}: ended {self._left} bytes before the part planned for it; "
                "did it change during the pack? Rerun it"
            )
        self._left -= len(data)
        return bytes(data)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class _Chunks(io.RawIOBase):
    """A read-only stream over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks, self._head = chunks, b""

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            out, self._head = self._head + b"".join(self._chunks), b""
            return out
        if not self._head and not self._take():
            return b""
        out, self._head = self._head[:size], self._head[size:]
        return out

    def _take(self) -> bool:
        if self._head:
            return True
        self._head = next(self._chunks, b"")
        return bool(self._head)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)
