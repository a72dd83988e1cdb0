"""Fetching over a slow or unreliable link: deadlines, hedged requests, and shards streamed into a file.

- Every request has a deadline, which the replicas' health gives (:mod:`ferry.client.fetching.health`).
- A request past its deadline is sent to the next replica as well (:func:`race`); the first good answer
  wins and the others are cancelled: an S3 request is a task on fsspec's event loop, and cancelling it
  closes its connection. A local read cannot be interrupted, so it runs in a bounded thread pool. The race
  tells the health record what each attempt did (:class:`RaceHealth`).
- A shard is read as parallel ranged reads of ``part_size`` bytes, at most ``connections`` in flight
  (:mod:`ferry.client.fetching.parts`), consumed in order by :class:`ShardSink`: its stored digest is
  computed as it streams and it is decompressed by a streaming zstd decoder straight into a file, checked
  against the manifest's raw size and digest at the end. Memory is a few parts per shard being fetched,
  never the shard. (The only replica of a dataset, when it is on a local disk, is read part after part by
  the fetching thread instead, its decoder pulling the parts: :meth:`ShardSink.drain`,
  :mod:`ferry.client.fetching.local`.)
"""

from __future__ import annotations

import asyncio
import http.client
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

import zstandard

from ferry.shard_tools.errors import FerryError, ShardDigestError, ShardFormatError, UsageError
from ferry.shard_tools.format.digest import Hasher, raw_hasher
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.shard import MAX_EXPANSION
from ferry.shard_tools.storage.store import Location

from .. import checks
from .direct import start_direct

__all__ = [
    "FetchOptions",
    "Missing",
    "RaceHealth",
    "RaceLost",
    "ReadsInto",
    "ShardSink",
    "SourceFailed",
    "race",
    "start_read",
    "start_small_read",
]

_WRITE = 1 << 20  # decoder output chunk: the decoder never holds more than this
# a shard read from a file is read and decoded in parts this size, through two buffers per thread, kept: the parts
# stay in the core's cache, and decoding into a kept buffer (not into a new bytes per chunk, as a pushed part is)
# was a tenth of a local fetch's CPU time in bench/
_PULLED = 1 << 20
_buffers = threading.local()


def _pull_buffers() -> tuple[memoryview, memoryview]:
    """This thread's buffers for stored bytes read from a file and the raw bytes decoded from them."""
    pair: tuple[memoryview, memoryview] | None = getattr(_buffers, "pair", None)
    if pair is None:
        pair = _buffers.pair = (memoryview(bytearray(_PULLED)), memoryview(bytearray(_PULLED)))
    return pair


class SourceFailed(Exception):
    """Reading the stored shard's file failed (an OSError of the source, not of the file being written)."""


class ReadsInto(Protocol):
    """A file read into a caller's buffer (a raw file: each call one read)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class _StoredReader:
    """The stored bytes of a file as the decoder reads them: checked and hashed by the sink as they pass."""

    def __init__(self, sink: ShardSink, source: ReadsInto, buf: memoryview) -> None:
        self.sink, self.source, self.buf = sink, source, buf

    def read(self, size: int) -> memoryview:
        try:
            n = self.source.readinto(self.buf[: min(size, len(self.buf))])
        except OSError as exc:
            raise SourceFailed(exc) from exc
        part = self.buf[: n or 0]
        if part:  # an empty part is the file's end (a short file is for finish to report)
            self.sink.stored_part(part)
        return part  # the decoder takes all of a part before it asks for the next one


@dataclass(frozen=True)
class FetchOptions:
    """How shards and manifests are fetched (``TokenDataset(fetch={...})``).

    part_size: bytes per ranged read of a shard (4 MiB: about 0.1 s at 40 MB/s; a 30 ms round trip costs
        ~22% of one connection, and 8 of them still carry 250 MB/s. Finer parts end a shard's fetch more
        evenly, so the next shard's parts start sooner and a cold first batch arrives earlier than with
        larger parts. On round trips of 100 ms or more raise it to 8-16 MiB.)
    connections: ranged reads in flight per process (8: fills a link of 8 capped connections; memory is
        at most ``2 * connections`` parts per shard being fetched: see :mod:`ferry.client.fetching.parts`).
    deadline_floor, deadline_slack: a request's deadline is ``floor + slack * expected`` seconds
        (2 s and 4x: a healthy request on a jittery link is not hedged, a hung one costs little more than the floor).
    prior_rate, prior_latency: assumed per-connection rate (bytes/s) and round trip before measurements.

    Each real-valued option lies in a range (``_FLOAT_RANGE``) that keeps every deadline finite.
    """

    part_size: int = 4 << 20
    connections: int = 8
    deadline_floor: float = 2.0
    deadline_slack: float = 4.0
    prior_rate: float = 10e6
    prior_latency: float = 0.1

    @classmethod
    def of(cls, value: Any) -> FetchOptions:
        """``None`` (defaults), a FetchOptions, or a mapping of its fields (checked)."""
        if value is None:
            return cls()
        if isinstance(value, FetchOptions):
            return value
        if not isinstance(value, dict):
            raise UsageError(f"fetch must be a mapping of fetch options, got {checks.show(value)}")
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"fetch: unknown option(s) {sorted(unknown)}; know {sorted(cls.__dataclass_fields__)}")
        out: dict[str, Any] = {}
        for key, v in value.items():
            if key in ("part_size", "connections"):
                low = 4096 if key == "part_size" else 1
                out[key] = (
                    checks.size(f"fetch.{key}", v) if key == "part_size" else checks.integer(f"fetch.{key}", v, 1)
                )
                if out[key] < low:
                    raise UsageError(f"fetch.{key} must be at least {low}, got {v}")
            else:
                lo, hi = _FLOAT_RANGE[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                    raise UsageError(f"fetch.{key} must be a number in [{lo:g}, {hi:g}], got {checks.show(v)}")
                out[key] = float(v)
        return cls(**out)


# the range of each real-valued option: every deadline stays a finite number of seconds
_FLOAT_RANGE = {
    "deadline_floor": (1e-3, 1e6),
    "deadline_slack": (1e-3, 1e6),
    "prior_rate": (1.0, 1e15),
    "prior_latency": (1e-6, 1e6),
}


class Missing(Exception):
    """The replica answered that it does not have the object (not a fault of the replica)."""


class RaceLost(Exception):
    """No replica gave a good answer: ``errors`` (url, text), ``missing`` replicas, ``timed_out``."""

    def __init__(self, errors: list[tuple[int, str]], missing: int, timed_out: int, kinds: set[type[Exception]]):
        super().__init__("; ".join(text for _, text in errors))
        self.errors, self.missing, self.timed_out, self.kinds = errors, missing, timed_out, kinds


def start_read(
    loc: Location, rel: str, start: int | None, end: int | None, pool: Executor, direct: Executor | None = None
) -> Future[bytes]:
    """A cancellable read of ``rel`` (bytes ``[start, end)``, or all of it): with ``direct``, a range of an S3
    object with plain settings is a job there on a kept-alive connection (:mod:`ferry.client.fetching.direct`);
    else a task on the filesystem's event loop when it has one (cancelling closes the connection), else a job
    in ``pool``."""
    if direct is not None and start is not None and end is not None and start < end:
        fut = start_direct(loc, rel, start, end, direct, lambda: start_read(loc, rel, start, end, pool))
        if fut is not None:
            return fut
    fs, path = loc.fs, loc.full(rel)
    if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
        coro = fs._cat_file(path, start=start, end=end)
        return asyncio.run_coroutine_threadsafe(coro, fs.loop)
    return pool.submit(fs.cat_file, path, start=start, end=end)


def start_small_read(loc: Location, rel: str, start: int | None, end: int | None, pool: Executor) -> Future[bytes]:
    """:func:`start_read` of bytes ``[start, end)`` of an object a process reads before anything else (a manifest's
    first bytes): on S3 with plain settings, one signed GET without botocore, whose S3 client costs more to create
    (its service models parsed) than the read itself, and which a job whose shards are all in the node cache never
    needs. Anything but a good answer (an error, another status, a setting it does not handle) is read through the
    filesystem instead, in the same job."""
    url = loc.url.split("?", 1)[0]
    if start is None or end is None or not url.startswith(("s3://", "s3a://")):
        return start_read(loc, rel, start, end, pool)
    from ferry.shard_tools.storage.s3_get import fetch, plan_s3_get  # the http.client path loads only here

    def job() -> bytes:
        try:
            get = plan_s3_get(f"{url.rstrip('/')}/{rel}", getattr(loc.fs, "storage_options", {}), os.environ)
            if get is not None:
                body = fetch(get, end - start, (start, end))
                if body is not None:
                    return body
        except (OSError, http.client.HTTPException, ValueError):
            pass
        return bytes(loc.fs.cat_file(loc.full(rel), start=start, end=end))

    return pool.submit(job)


class RaceHealth(Protocol):
    """What :func:`race` asks of the replicas' health and tells it
    (:class:`ferry.client.fetching.health.ReplicaHealth`). ``kind`` names the ranking a failure moves a replica
    down in (shards, or manifests)."""

    def deadline(self, i: int, nbytes: int) -> float:
        """Seconds replica ``i`` may take for a request of ``nbytes``."""
        ...

    def answered(self, i: int, nbytes: int, seconds: float) -> None:
        """A good answer."""
        ...

    def refused(self, i: int, nbytes: int, seconds: float, kind: str) -> None:
        """An answer that failed its check."""
        ...

    def failed(self, i: int, exc: BaseException, seconds: float, kind: str) -> str:
        """A request that raised: ``"missing"`` (the replica lacks the object) or ``"failed"``."""
        ...

    def hedged(self, i: int) -> None:
        """Past its deadline: the next replica is asked too."""
        ...

    def unanswered(self, replicas: list[int]) -> None:
        """When the race ends: the replicas that passed their deadline and never answered (hung, not slow)."""
        ...


@dataclass
class _Attempt:
    replica: int
    started: float
    deadline: float


def race(
    tries: list[int],
    start: Callable[[int], Future[bytes]],
    check: Callable[[int, bytes], None] | None,
    health: RaceHealth,
    *,
    nbytes: int,
    kind: str,
    spare: int | None = None,
) -> tuple[int, bytes]:
    """Ask ``tries[0]`` for ``nbytes``; on an error ask the next at once, past a deadline ask the next too; first
    good answer wins, the rest are cancelled. ``check`` raises on a bad answer. ``spare``: a replica asked once
    more when the last one passes its deadline (a single replica: a new connection). ``health`` gives the
    deadlines and is told of every answer, error, hedge, and (when the race ends) of the replicas that passed
    their deadline and never answered. Raises :class:`RaceLost`."""
    running: dict[Future[bytes], _Attempt] = {}
    lost = _Losses()
    queue = list(tries)
    winner: int | None = None

    def ask(i: int) -> None:
        now = time.monotonic()
        running[start(i)] = _Attempt(i, now, now + health.deadline(i, nbytes))

    try:
        for _ in range(4 * len(tries) + 4):  # each round starts, finishes or times out an attempt
            if not running and queue:
                ask(queue.pop(0))
            if not running:
                break
            newest = max(running.values(), key=lambda a: a.started)
            left = min(max(0.0, newest.deadline - time.monotonic()), threading.TIMEOUT_MAX)  # a wait has a limit
            done, _ = wait(list(running), timeout=left, return_when=FIRST_COMPLETED)
            for fut in done:
                att = running.pop(fut)
                data = _judged(fut, att, check, health, kind, lost)
                if data is not None:
                    winner = att.replica
                    return att.replica, data
            if done:
                continue
            health.hedged(newest.replica)  # past its deadline: keep it running, ask the next replica too
            newest.deadline = float("inf")
            if not queue and spare is not None:
                queue, spare = [spare], None
            if queue:
                ask(queue.pop(0))
            elif all(a.deadline == float("inf") for a in running.values()):
                break
        for att in running.values():
            lost.timed_out += 1
            lost.errors.append((att.replica, f"no answer within {time.monotonic() - att.started:.1f}s (deadline)"))
        raise RaceLost(lost.errors, lost.missing, lost.timed_out, lost.kinds)
    finally:
        for fut in running:
            fut.cancel()  # the losers: an S3 task is cancelled and its connection closed
        # the replica that answered (perhaps on another connection) is not hung, however late its other attempt
        unanswered = sorted({a.replica for a in running.values() if a.deadline == float("inf")} - {winner})
        if unanswered:
            health.unanswered(unanswered)


class _Losses:
    """The attempts of a race that gave no good answer."""

    def __init__(self) -> None:
        self.errors: list[tuple[int, str]] = []
        self.kinds: set[type[Exception]] = set()
        self.missing = self.timed_out = 0


def _judged(
    fut: Future[bytes],
    att: _Attempt,
    check: Callable[[int, bytes], None] | None,
    health: RaceHealth,
    kind: str,
    lost: _Losses,
) -> bytes | None:
    """The answer of a finished attempt if it is good (``health`` told either way), else None (``lost`` told)."""
    elapsed = time.monotonic() - att.started
    try:
        data = fut.result()
    except Exception as exc:  # noqa: BLE001 — every failure of one replica is a reason to try the next
        outcome = health.failed(att.replica, exc, elapsed, kind)
        lost.missing += outcome == "missing"
        lost.errors.append((att.replica, "missing" if outcome == "missing" else _text(exc)))
        lost.kinds.add(type(exc))
        return None
    try:
        if check is not None:
            check(att.replica, data)
    except Exception as exc:  # noqa: BLE001 — a bad answer is a reason to try the next replica
        health.refused(att.replica, len(data), elapsed, kind)
        lost.errors.append((att.replica, _text(exc)))
        lost.kinds.add(type(exc))
        return None
    health.answered(att.replica, len(data), elapsed)
    return data


def _text(exc: BaseException) -> str:
    """A failed attempt in words: a ferry error's message; another's with its class, which often says more
    than the message (aiohttp's ``TooManyRedirects`` reads ``0, message='', url=...``)."""
    return str(exc) if isinstance(exc, FerryError) else f"{type(exc).__name__}: {exc}"


class _RawOut:
    """Where the decoder writes: counted against the manifest's raw size, hashed, written to the file."""

    def __init__(self, info: ShardInfo, out: BinaryIO) -> None:
        self.info, self.out = info, out
        self.hasher = raw_hasher(info.frame_size)  # tree-shaped in stored format 3, as the row says
        self.written = 0

    def write(self, data: bytes | memoryview) -> int:
        self.written += len(data)
        if self.written > self.info.raw_bytes:
            raise ShardFormatError(
                self.info.path, f"frame yields more than the {self.info.raw_bytes} raw bytes it declares"
            )
        self.hasher.update(data)
        self.out.write(data)
        return len(data)


class ShardSink:
    """A stored shard taken in order, part by part (pushed: :meth:`feed`; pulled from a file: :meth:`drain`):
    stored digest as it streams, decoded into ``out``."""

    def __init__(self, info: ShardInfo, out: BinaryIO) -> None:
        if info.raw_bytes < 0 or info.raw_bytes > MAX_EXPANSION * max(info.stored_bytes, 1):
            raise ShardFormatError(
                info.path,
                f"manifest says {info.raw_bytes} raw bytes from {info.stored_bytes} stored bytes, more than any "
                f"zstd frame expands (at most {MAX_EXPANSION}:1): a decompression bomb or a corrupt manifest",
            )
        self.info = info
        self.stored = Hasher()
        self.raw = _RawOut(info, out)
        self._decoder = zstandard.ZstdDecompressor()
        self._writer: Any = None  # the decoder parts are pushed into (feed), made by the first
        self._head = b""

    def feed(self, data: bytes | memoryview) -> None:
        """Take the next part of the stored bytes (parts arrive in order)."""
        self.stored_part(data)
        if self._writer is None:
            self._writer = self._decoder.stream_writer(self.raw, write_size=_WRITE, closefd=False)  # type: ignore[arg-type]  # needs only write()
        try:
            self._writer.write(data)
        except zstandard.ZstdError as exc:
            raise self._invalid(exc) from exc

    def drain(self, source: ReadsInto) -> None:
        """Take all the stored bytes from ``source``, a file read to its end: the decoder pulls them, into this
        thread's buffers. A SourceFailed when reading ``source`` fails; then, and on any error, the sink is done."""
        stored, raw = _pull_buffers()
        reader = self._decoder.stream_reader(
            _StoredReader(self, source, stored),  # type: ignore[arg-type]  # needs only read()
            read_size=len(stored),
            read_across_frames=True,
            closefd=False,
        )
        try:
            while n := reader.readinto(raw):
                self.raw.write(raw[:n])
        except zstandard.ZstdError as exc:
            raise self._invalid(exc) from exc

    def stored_part(self, data: bytes | memoryview) -> None:
        """Check and hash the next part of the stored bytes."""
        if self.stored.nbytes + len(data) > self.info.stored_bytes:
            raise ShardFormatError(
                self.info.path, f"stored copy is longer than the {self.info.stored_bytes} bytes the manifest says"
            )
        if len(self._head) < 18:
            self._head += data[: 18 - len(self._head)]
            if len(self._head) >= min(18, self.info.stored_bytes):
                self._check_header()
        self.stored.update(data)

    def _invalid(self, exc: zstandard.ZstdError) -> ShardFormatError:
        return ShardFormatError(self.info.path, f"not a valid zstd frame ({exc}); the shard is truncated or corrupt")

    def _check_header(self) -> None:
        info = self.info
        if self._head[:4] != zstandard.FRAME_HEADER:
            raise ShardFormatError(
                info.path, "does not start with a zstd frame; the shard is corrupt or not a ferry shard"
            )
        try:
            size = zstandard.get_frame_parameters(self._head).content_size
        except zstandard.ZstdError as exc:
            raise ShardFormatError(
                info.path, f"unreadable zstd frame header ({exc}); the shard is truncated or corrupt"
            ) from exc
        # format 1 is one frame of the whole raw shard; formats 2 and 3's first frame holds at most all of it (the
        # frame index pins every frame's size and is checked by the frame reader; here the whole-shard digests)
        if size != info.raw_bytes if info.stored_format == 1 else not 0 < size <= max(info.raw_bytes, 1):
            raise ShardFormatError(info.path, f"frame says {size} raw bytes, manifest says {info.raw_bytes}")

    def finish(self) -> None:
        """Every check of :func:`ferry.shard_tools.dataset.decode_stored_shard`, on what streamed through."""
        info = self.info
        if self.stored.nbytes != info.stored_bytes:
            raise ShardFormatError(
                info.path, f"stored size is {self.stored.nbytes} bytes, manifest says {info.stored_bytes} (truncated?)"
            )
        if self.stored.hexdigest() != info.stored_digest:
            raise ShardDigestError(info.path, "stored bytes do not match the manifest digest (corrupt copy)")
        if self._writer is not None:
            self._writer.flush()
        if self.raw.written != info.raw_bytes:
            raise ShardFormatError(
                info.path, f"decompressed to {self.raw.written} bytes, manifest says {info.raw_bytes}"
            )
        if self.raw.hasher.hexdigest() != info.raw_digest:
            raise ShardDigestError(info.path, "decompressed bytes do not match the manifest raw digest")
