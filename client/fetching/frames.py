"""Reading format-3 shards by frames: the index once, then only the frames a token or document range touches.

A :class:`FrameReader` is given a ranged-read callable ``read_range(info, offset, length) -> bytes``
(:meth:`ferry.client.fetching.replicas.Replicas.read_range` in the loader: the first replica that has the bytes, with
deadlines and hedging). Per shard it reads the frame index once (one ranged read of the shard's tail, checked
against the manifest's ``index_bytes`` / ``index_digest``, and its leaves against the manifest's raw digest)
and checks it against the Arrow metadata at the head of the raw file (frame 0, checked against its leaf:
:func:`ferry.shard_tools.format.seekable.check_layout`) before reading anything through it; then it maps a raw
byte range to frames, reads the missing ones (adjacent frames in one ranged read), checks each against the index's
digest before decompressing it (the bounds of :func:`ferry.shard_tools.format.shard.decompress`) and its raw bytes
against its leaf after, and keeps decoded frames in an LRU block cache bounded in bytes. So every frame
delivered holds the raw bytes the manifest's raw digest names. Format-2 shards (a flat raw digest: no
frame can be checked against it alone) are not read by frames: the loader reads them whole.
With ``checked_reads`` the digests are checked inside the ranged read, so a replica's bad bytes are
refused there and the next replica's taken. One per process, used from one thread (like ``ShardReader``).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.shard_tools.errors import ShardError, ShardFormatError, ShardMissingError, StorageError
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.seekable import (
    FrameIndex,
    check_frame,
    check_layout,
    decode_frame,
    decode_head,
    load_index,
    max_index_bytes,
)
from ferry.shard_tools.storage.store import resolve

from .local import LocalRanges
from .pools import DaemonPool

__all__ = ["RangeRead", "FrameReader", "FrameStats", "frame_reader_for", "DEFAULT_BLOCK_LIMIT"]

#: ``read_range(info, offset, length)``: ``length`` stored bytes of shard ``info`` from ``offset``.
RangeRead = Callable[..., bytes]
DEFAULT_BLOCK_LIMIT = 256 << 20
_MAX_INDEXES = 4096  # frame indexes kept per process (a few KiB each)


@dataclass
class FrameStats:
    """What a frame reader fetched: ranged reads of indexes and frames, their bytes, and block-cache hits."""

    index_reads: int = 0
    frame_reads: int = 0  # ranged reads of frames (adjacent frames share one)
    frames: int = 0  # frames fetched and decoded
    bytes_read: int = 0
    hits: int = 0  # frames found in the block cache


class FrameReader:
    """Frames of format-3 shards, fetched by ranged reads, verified, decoded and cached (``limit`` bytes).

    ``threads``: ranged reads in flight at once when a batch's frames are fetched together
    (:meth:`prefetch_tokens`): a batch of samples over many shards then costs about one round trip for
    the indexes and one for the frames, not one per sample.
    """

    def __init__(
        self,
        read_range: RangeRead,
        *,
        limit: int = DEFAULT_BLOCK_LIMIT,
        threads: int = 8,
        checked_reads: bool = False,
        whole: Callable[[ShardInfo], bool] | None = None,
    ) -> None:
        self.read_range = read_range
        # whole(info): the shard is whole on the node now (its disk cache), so frames fetched ahead for it are
        # not fetched (the reads that follow take the shard from there)
        self.whole = whole
        # read_range takes a keyword ``check`` (Replicas.read_range): a replica's bad bytes are refused in the
        # read and another replica's taken, instead of the shard being read whole
        self.checked_reads = checked_reads
        self.limit = max(0, int(limit))
        self.threads = max(1, int(threads))
        self.stats = FrameStats()
        self._indexes: OrderedDict[str, FrameIndex] = OrderedDict()
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the stats, counted from the fetching threads
        self._pool: DaemonPool | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _read(
        self, info: ShardInfo, offset: int, length: int, what: str, check: Callable[[bytes], None] | None = None
    ) -> bytes:
        """``length`` stored bytes at ``offset``, refused unless ``check`` passes: with ``checked_reads`` a
        replica's bad answer is refused in the read itself, so the next replica's is taken."""
        try:
            if self.checked_reads and check is not None:
                data = self.read_range(info, offset, length, check=check)
            else:
                data = self.read_range(info, offset, length)
        except FileNotFoundError as exc:
            raise ShardMissingError(info.path, f"listed in the manifest but missing ({exc})") from exc
        if len(data) != length:
            raise ShardFormatError(
                info.path, f"{what}: read {len(data)} of {length} bytes at {offset}; the shard is truncated"
            )
        if check is not None and not self.checked_reads:  # else read_range has run it on these very bytes
            check(data)
        with self._lock:
            self.stats.bytes_read += length
        return data

    def _fetch_index(self, info: ShardInfo) -> FrameIndex:
        """The frame index as the manifest row pins it (size, structure, digest, leaves); its Arrow positions
        are checked by :meth:`_checked` before any frame is read through it."""
        if info.stored_format != 3:
            raise ShardFormatError(info.path, f"is a format-{info.stored_format} shard, not read by frames: read whole")
        if info.index_bytes > max_index_bytes(info.raw_bytes):  # refused before a byte is asked for
            raise ShardFormatError(
                info.path,
                f"manifest says its frame index is {info.index_bytes} bytes; no index of a "
                f"{info.raw_bytes}-byte file exceeds {max_index_bytes(info.raw_bytes)}",
            )
        index: list[FrameIndex] = []
        offset = info.stored_bytes - info.index_bytes
        self._read(info, offset, info.index_bytes, "frame index", lambda data: index.append(load_index(data, info)))
        with self._lock:
            self.stats.index_reads += 1
        return index[-1]

    def _checked(self, info: ShardInfo, index: FrameIndex, head: bytes | None = None) -> FrameIndex:
        """``index`` checked against the Arrow metadata at the head of the raw file (raw bytes ``[0,
        offsets_pos)``, ``head`` when already read) and kept; on a mismatch nothing read through it stays
        cached."""
        try:
            checked = check_layout(self._head(info, index) if head is None else head, index, info)
        except (ShardError, StorageError):
            self._forget(info.path)
            raise
        self._keep_index(info, checked)
        return checked

    def _head(self, info: ShardInfo, index: FrameIndex) -> bytes:
        """Raw bytes ``[0, offsets_pos)``: from the block cache, else (within frame 0, as in every shard ferry
        writes) frame 0 read, checked against the index and its leaf, and cut to the head."""
        ks = index.frames_of(0, max(1, index.offsets_pos))
        if len(ks) == 1 and (info.path, 0) not in self._blocks:
            return self._read_head(info, index)
        return b"".join(self._blocks_of(info, index, ks))[: index.offsets_pos]

    def _read_head(self, info: ShardInfo, index: FrameIndex) -> bytes:
        offset, length = index.span(0)
        data = self._read(info, offset, length, "frame 0", lambda data: check_frame(index, 0, data, info.path))
        with self._lock:
            self.stats.frame_reads += 1
            self.stats.frames += 1
        return decode_head(index, data, index.offsets_pos, info.path)

    def _forget(self, path: str) -> None:
        """Drop the index and every cached frame of shard ``path``."""
        self._indexes.pop(path, None)
        for key in [key for key in self._blocks if key[0] == path]:
            self._bytes -= len(self._blocks.pop(key))

    def _keep_index(self, info: ShardInfo, index: FrameIndex) -> None:
        self._indexes[info.path] = index
        if len(self._indexes) > _MAX_INDEXES:
            self._indexes.popitem(last=False)

    def index(self, info: ShardInfo) -> FrameIndex:
        """The checked frame index of a format-3 shard (read once per process, kept for the last few thousand)."""
        index = self._indexes.get(info.path)
        if index is not None:
            self._indexes.move_to_end(info.path)
            return index
        return self._checked(info, self._fetch_index(info))

    def _fetch_run(self, info: ShardInfo, index: FrameIndex, run: list[int]) -> list[bytes]:
        """Consecutive frames ``run`` in one ranged read, each checked and decoded."""
        start, _ = index.span(run[0])
        last, last_len = index.span(run[-1])

        def digests(data: bytes) -> None:
            view = memoryview(data)
            for k in run:
                offset, length = index.span(k)
                check_frame(index, k, view[offset - start : offset - start + length], info.path)

        data = memoryview(self._read(info, start, last + last_len - start, f"frames {run[0]}-{run[-1]}", digests))
        out = []
        for k in run:
            offset, length = index.span(k)
            out.append(decode_frame(index, k, data[offset - start : offset - start + length], info.path))
        with self._lock:
            self.stats.frame_reads += 1
            self.stats.frames += len(run)
        return out

    def _fetch_ahead(self, info: ShardInfo, index: FrameIndex, run: list[int]) -> list[bytes]:
        """:meth:`_fetch_run` for :meth:`prefetch_tokens`: nothing when the shard has become whole on the node."""
        if self.whole is not None and self.whole(info):
            raise _Whole(info.path)
        return self._fetch_run(info, index, run)

    def _keep(self, key: tuple[str, int], raw: bytes) -> None:
        self._blocks[key] = raw
        self._bytes += len(raw)
        while self._bytes > self.limit and len(self._blocks) > 1:
            _, old = self._blocks.popitem(last=False)
            self._bytes -= len(old)

    def frames(self, info: ShardInfo, ks: range) -> list[bytes]:
        """Decoded frames ``ks`` of a shard: cached ones from memory, each run of missing ones in one read."""
        return self._blocks_of(info, self.index(info), ks)

    def _blocks_of(self, info: ShardInfo, index: FrameIndex, ks: range) -> list[bytes]:
        out: dict[int, bytes] = {}
        missing: list[int] = []
        for k in ks:
            block = self._blocks.get((info.path, k))
            if block is None:
                missing.append(k)
            else:
                self._blocks.move_to_end((info.path, k))
                self.stats.hits += 1
                out[k] = block
        for run in _runs(missing):
            for k, raw in zip(run, self._fetch_run(info, index, run), strict=True):
                self._keep((info.path, k), raw)
                out[k] = raw
        return [out[k] for k in ks]

    def _parallel(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
        """``fn(*call)`` for every call, ``threads`` at a time; an exception is returned, not raised."""

        def one(call: tuple[Any, ...]) -> Any:
            try:
                return fn(*call)
            except Exception as exc:  # noqa: BLE001 - raised again when the frame is read in order
                return exc

        if self._pool is None:
            self._pool = DaemonPool(self.threads, thread_name_prefix="ferry-frames")
        return list(self._pool.map(one, calls))

    def prefetch_tokens(self, items: Sequence[tuple[ShardInfo, int, int]], dtype: np.dtype) -> None:
        """Fetch together every index and frame that token ranges ``(info, a, b)`` need and the block cache
        lacks (indexes first, then the frames), so reading them afterwards hits the cache. Failures are
        left for that read, which raises them (or the reader's fallback handles them)."""
        if self.threads <= 1:
            return
        infos = {info.path: info for info, _, _ in items}
        todo = [(info,) for path, info in infos.items() if path not in self._indexes]
        unchecked = {
            info.path: index
            for (info,), index in zip(todo, self._parallel(self._fetch_index, todo), strict=True)
            if isinstance(index, FrameIndex)
        }
        spans = []
        for info, a, b in items:
            index = self._indexes.get(info.path) or unchecked.get(info.path)
            if index is not None and a < b:
                spans.append(
                    (info, index, index.tokens_pos + a * dtype.itemsize, index.tokens_pos + b * dtype.itemsize)
                )
        calls: list[tuple[Any, ...]] = []
        planned: set[tuple[str, int]] = set()
        for info, index, start, end in spans:
            end = min(end, info.raw_bytes)
            if start >= end:
                continue
            ks = index.frames_of(start, end)
            missing = [k for k in ks if (info.path, k) not in self._blocks and (info.path, k) not in planned]
            planned.update((info.path, k) for k in missing)
            calls += [(self._fetch_ahead, info, index, run) for run in _runs(missing)]
        # each new index's Arrow head (its check) travels with the samples' frames: one round trip for all
        heads = [
            (path, index)
            for path, index in unchecked.items()
            if len(index.frames_of(0, max(1, index.offsets_pos))) == 1
        ]
        calls += [(self._read_head, infos[path], index) for path, index in heads]
        results = self._parallel(lambda fn, *args: fn(*args), calls) if calls else []
        for call, got in zip(calls, results, strict=True):
            if call[0] == self._fetch_ahead and isinstance(got, list):
                for k, raw in zip(call[3], got, strict=True):
                    self._keep((call[1].path, k), raw)
        got_heads = dict(zip((path for path, _ in heads), results[len(results) - len(heads) :], strict=True))
        for path, index in unchecked.items():
            head = got_heads.get(path)
            with contextlib.suppress(ShardError, StorageError):  # raised again when the shard is read
                self._checked(infos[path], index, head if isinstance(head, bytes) else None)

    def raw(self, info: ShardInfo, start: int, end: int) -> bytes | memoryview:
        """Raw (decompressed) bytes ``[start, end)`` of a shard."""
        if not 0 <= start < end <= info.raw_bytes:
            raise ShardFormatError(info.path, f"raw range {start}-{end} is outside the {info.raw_bytes}-byte file")
        index = self.index(info)
        ks = index.frames_of(start, end)
        blocks = self.frames(info, ks)
        base = ks.start * index.frame_size
        if len(blocks) == 1:
            return memoryview(blocks[0])[start - base : end - base]
        return b"".join(blocks)[start - base : end - base]

    def tokens(self, info: ShardInfo, dtype: np.dtype, a: int, b: int) -> np.ndarray:
        """Tokens ``[a, b)`` of the shard's flat token stream (documents with their EOS)."""
        if not 0 <= a <= b <= info.tokens:
            raise ShardFormatError(info.path, f"token range {a}-{b} is outside its {info.tokens} tokens")
        if a == b:
            return np.empty(0, dtype=dtype)
        index = self.index(info)
        if dtype.itemsize != index.itemsize:
            raise ShardFormatError(info.path, f"holds {8 * index.itemsize}-bit token ids, the manifest says {dtype}")
        pos = index.tokens_pos
        return np.frombuffer(self.raw(info, pos + a * dtype.itemsize, pos + b * dtype.itemsize), dtype=dtype)

    def offsets(self, info: ShardInfo, d0: int, d1: int) -> np.ndarray:
        """Document offsets ``d0..d1`` inclusive (document ``d`` is tokens ``[o[d], o[d + 1])``), checked."""
        if not 0 <= d0 <= d1 <= info.documents:
            raise ShardFormatError(info.path, f"document range {d0}-{d1} is outside its {info.documents} documents")
        pos = self.index(info).offsets_pos
        out = np.frombuffer(self.raw(info, pos + 4 * d0, pos + 4 * (d1 + 1)), dtype="<i4").astype(np.int64)
        if int(out[0]) < 0 or int(out[-1]) > info.tokens or bool(np.any(np.diff(out) < 0)):
            raise ShardFormatError(info.path, f"document offsets {d0}-{d1} are out of order or past its tokens")
        return out


class _Whole(Exception):  # noqa: N818 — a signal, returned by _parallel and dropped: the shard is read whole
    """Frames not fetched ahead: their shard is whole on the node."""


def _runs(ks: list[int]) -> list[list[int]]:
    """Consecutive runs of sorted frame numbers (each one ranged read)."""
    runs: list[list[int]] = []
    for k in ks:
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def frame_reader_for(
    manifest: Any, replicas: Any, budget: int, whole: Callable[[ShardInfo], bool] | None = None
) -> FrameReader | None:
    """A frame reader for a dataset holding format-3 shards (None when it has none), its block cache a
    quarter of this process's cache budget, between 8 and 256 MiB. Frames of a batch are fetched 8 at a
    time from remote replicas (round trips overlap); one at a time from local files (faster there: the
    reads cost no wait, and threads only contend for the cores), and from the only replica, on a local disk, by
    the calling thread itself (:class:`ferry.client.fetching.local.LocalRanges`). ``whole``: see
    :class:`FrameReader`."""
    if not bool(np.any(manifest.shards.frame_size > 0)):
        return None
    local = not replicas.remote
    limit = min(DEFAULT_BLOCK_LIMIT, max(8 << 20, budget // 4))
    read: RangeRead = replicas.read_range
    if replicas.direct():
        read = LocalRanges(resolve(replicas.urls[0], replicas.options[0]))
    return FrameReader(read, limit=limit, threads=1 if local else 8, checked_reads=True, whole=whole)
