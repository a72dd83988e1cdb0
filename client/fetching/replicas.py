"""The replicas of one dataset: read its manifest and its stored shards from the first healthy one.

Replicas are given nearest first. Every request has a deadline; past it the same request goes to the next replica
too, the first good answer wins and the others are cancelled (:func:`ferry.client.fetching.fetch.race`). Which
replica is asked first, the deadlines, and what slow, failing, hung or partial replicas cost them is the
:class:`ferry.client.fetching.health.ReplicaHealth` this object holds. Every stored shard is checked against the
manifest (size, stored digest, decompressed size and raw digest) as it streams into the cache; with a ``cache_dir``
the manifest's shard table is read through the node cache, once per node (:mod:`ferry.client.fetching.tables`).
Filesystems, thread pools and connections are per process, so the object can be pickled into DataLoader workers. A URL
is printed (in errors, stats and states) as :func:`shown` makes it: without the user info and query string a URL may
carry credentials in.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, BinaryIO
from urllib.parse import SplitResult, urlsplit, urlunsplit

from ferry.shard_tools.errors import (
    DatasetError,
    DatasetNotFoundError,
    ManifestError,
    ShardError,
    ShardMissingError,
    StorageError,
    UsageError,
)
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.header import MANIFEST_FILE, version_path
from ferry.shard_tools.format.manifest import Manifest, ShardInfo
from ferry.shard_tools.storage.store import Location, resolve

from ..checks import show
from ..stats import COUNTERS
from .arrived import ArrivedBytes, pieces
from .fetch import FetchOptions, RaceLost, ShardSink, SourceFailed, race, start_read, start_small_read
from .health import MANIFESTS, SHARDS, ReplicaHealth
from .local import on_local_disk, open_regular
from .parts import Entry, PartQueue
from .pools import DaemonPool, PriorityPool
from .tables import cached_table

__all__ = ["Replicas", "shown"]

_MANIFEST_HINT = 1 << 20  # a manifest header is read as one ranged GET of this many bytes (it is far smaller)


def shown(url: str) -> str:
    """``url`` as ferry prints it: without user info (``user:password@``), query string or fragment, where
    credentials and tokens go (``https://user:pw@host/ds?token=...`` is shown as ``https://host/ds``)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: cut what may hide a secret without parsing
        return re.sub(r"^([^:/?#]+://)[^/?#]*@", r"\1", url).partition("?")[0].partition("#")[0]
    if len(parts.scheme) < 2 or not (parts.netloc and "@" in parts.netloc or parts.query or parts.fragment):
        return url  # a plain (or Windows) path, or nothing to hide
    return urlunsplit((parts.scheme, _host(parts), parts.path, "", ""))


# Azure URLs name the container before the "@" (abfs://container@account.dfs.core.windows.net/path)
_CONTAINER_AT = {"abfs", "abfss", "az", "wasb", "wasbs"}


def _host(parts: SplitResult) -> str:
    """The netloc without user info (an Azure container name, without a ":", stays)."""
    user, at, host = parts.netloc.rpartition("@")
    return parts.netloc if at and parts.scheme.lower() in _CONTAINER_AT and ":" not in user else host


def _secrets(url: str) -> list[str]:
    """The user info, password and query string of ``url`` (longest first), to scrub from other text."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []  # its shown form already leaves them out; text quoting it whole is replaced whole
    if len(parts.scheme) < 2:
        return []
    user = parts.netloc[: len(parts.netloc) - len(_host(parts))].rstrip("@")
    hidden = [user, parts.password or "", parts.query]
    return sorted({h for h in hidden if len(h) >= 4}, key=len, reverse=True)  # shorter ones: too common to cut


class _Pools:
    """This process's threads: ``parts`` runs ranged reads of shards (``connections`` at a time), those of the
    shard needed soonest first, ``io`` runs reads of filesystems without an event loop (local files), ``direct``
    ranged S3 reads past fsspec (:mod:`ferry.client.fetching.direct`)."""

    def __init__(self, connections: int) -> None:
        self.parts = PriorityPool(connections, "ferry-fetch")  # never holds up the end of the process
        self.io = DaemonPool(2 * connections, "ferry-io")
        # ranged S3 reads on kept-alive connections, one per thread (hedges and frame reads beside the parts)
        self.direct = DaemonPool(4 * connections, "ferry-s3")

    def shutdown(self) -> None:
        self.parts.shutdown(wait=False, cancel_futures=True)
        self.io.shutdown(wait=False, cancel_futures=True)
        self.direct.shutdown(wait=False, cancel_futures=True)


class Replicas:
    """One dataset at several URLs (nearest first)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        storage_options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        fetch: FetchOptions | Mapping[str, Any] | None = None,
        cache_dir: str | None = None,
        share_fills: bool = False,
    ) -> None:
        """``cache_dir``: the node cache (the loader's shard cache directory) that manifests' shard tables are
        read through, once per node (see :mod:`ferry.client.fetching.tables`); None: each read from storage.
        ``share_fills``: a loader that reads frames of shards while they are fetched whole: each fill keeps its
        parts on the node's disk for those reads, and they wait for the parts it is fetching (see
        :mod:`ferry.client.fetching.arrived`). Without it a fill still reads the frames that arrived before."""
        self.urls = _urls(urls)
        self.cache_dir = None if cache_dir is None else os.path.abspath(cache_dir)
        self.names = [shown(u) for u in self.urls]  # what errors, stats and states show of each URL
        if storage_options is None or isinstance(storage_options, Mapping):
            self.options = [dict(storage_options or {}) for _ in self.urls]
        else:
            plain = isinstance(storage_options, Sequence) and not isinstance(storage_options, (str, bytes))
            if not plain or not all(isinstance(o, Mapping) for o in storage_options):
                # by type only: the value is likely to hold keys and secrets (a JSON string of the mapping)
                names = [type(o).__name__ for o in storage_options] if plain else [type(storage_options).__name__]
                kinds = f"a list of {', '.join(names[:8])}" if plain else f"a value of type {names[0]}"
                raise UsageError(f"storage_options must be a mapping or a list of them, got {kinds}")
            self.options = [dict(o) for o in storage_options]
            if len(self.options) != len(self.urls):
                raise UsageError(
                    f"storage_options has {len(self.options)} mappings for {len(self.urls)} URLs: "
                    "give one mapping for all, or one per URL"
                )
        self.fetch_options = FetchOptions.of(dict(fetch) if isinstance(fetch, Mapping) else fetch)
        self.health = ReplicaHealth(self.names, self.fetch_options)  # nearest healthy first, deadlines
        self._locations: dict[int, Location] = {}
        self._pools: _Pools | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._tickets = itertools.count()  # the order shard fetches start in: the earlier one's parts go first
        self._later = threading.local()  # .depth > 0: this thread's fetches are for later batches
        self._now_waits = 0  # threads of this process waiting for another's fetch of a shard read now
        self._later_fills: weakref.WeakSet[PartQueue] = weakref.WeakSet()  # the parts of this process's prefetches
        self._direct: bool | None = None  # see direct()
        # stored bytes read from remote replicas before a shard is whole in the node cache, shared by the node's
        # processes, so a frame read and the fill of its shard fetch each byte once (see .arrived)
        self.arrived = ArrivedBytes(self.cache_dir) if self.cache_dir is not None and self.remote else None
        self.share_fills = share_fills

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # re-made where received (direct() too: it is the receiving host's mount table that says)
        state.update(_locations={}, _pools=None, _lock=None, _tickets=None, _later=None, _direct=None)
        state.update(_now_waits=0, _later_fills=None)  # this process's waits and fills
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._tickets, self._later = threading.Lock(), itertools.count(), threading.local()
        self._later_fills = weakref.WeakSet()

    @contextlib.contextmanager
    def for_later(self) -> Iterator[None]:
        """Shards fetched by this thread inside the ``with`` are for later batches (a prefetch): their parts
        yield the connections to those of a shard read now (a read that waits for it, or one read by frames)."""
        self._later.depth = getattr(self._later, "depth", 0) + 1
        try:
            yield
        finally:
            self._later.depth -= 1

    @contextlib.contextmanager
    def waiting_now(self) -> Iterator[None]:
        """This thread waits, inside the ``with``, while another process fetches a shard it reads now. Meanwhile
        this process's fetches for later (:meth:`for_later`) keep one part in flight: each process ranks its own
        fetches, and this one's prefetch would otherwise take half the link from the other's fetch. When the
        last such wait ends, they ask their parts again at once."""
        if getattr(self._later, "depth", 0) > 0:
            yield
            return
        self._fresh()
        with self._lock:
            self._now_waits += 1
        try:
            yield
        finally:
            with self._lock:
                self._now_waits -= 1
                woken = list(self._later_fills) if not self._now_waits else []
            for fill in woken:
                fill.wake()

    def _later_limit(self) -> int:
        """Reads in flight a fetch for later may keep now (see :meth:`waiting_now`)."""
        return 1 if self._now_waits else self.fetch_options.connections

    def _fresh(self) -> None:
        if self._pid != os.getpid():  # forked: do not share another process's connections or threads
            self._locations, self._pools, self._lock = {}, None, threading.Lock()
            self._now_waits, self._later_fills = 0, weakref.WeakSet()
            self.health.fresh_lock()
            self._pid = os.getpid()

    def _location(self, i: int) -> Location:
        self._fresh()
        loc = self._locations.get(i)
        if loc is None:
            loc = resolve(self.urls[i], self.options[i])
            self._locations[i] = loc
        return loc

    def _pool(self) -> _Pools:
        self._fresh()
        with self._lock:
            if self._pools is None:
                self._pools = _Pools(self.fetch_options.connections)
            return self._pools

    @property
    def remote(self) -> bool:
        """Whether some replica is remote by its URL (a scheme other than ``file://``); nothing is resolved."""
        return any("://" in u and not u.startswith("file://") for u in self.urls)

    def local(self, i: int) -> bool:
        """Whether replica ``i`` is on a local filesystem (resolving it reads nothing)."""
        try:
            return self._location(i).local
        except StorageError:
            return False

    def direct(self) -> bool:
        """Whether the dataset's only replica is on a local disk, so that its reads run in the calling thread,
        without the race (see :mod:`ferry.client.fetching.local`); decided once."""
        if self._direct is None:
            self._direct = len(self.urls) == 1 and self.local(0) and on_local_disk(self._location(0).full(""))
        return self._direct

    def close(self) -> None:
        """Stop this process's fetch threads (they are started again when needed)."""
        if self._pools is not None and self._pid == os.getpid():
            self._pools.shutdown()
        self._pools = None

    # --- one request, raced across replicas -------------------------------------------------------------------

    def _read(
        self,
        rel: str,
        span: tuple[int, int] | None,
        nbytes: int,
        order: list[int],
        *,
        kind: str,
        check: Callable[[int, bytes], None] | None = None,
        exclude: frozenset[int] = frozenset(),
        small: bool = False,
    ) -> tuple[int, bytes]:
        """Bytes ``span = (start, end)`` of ``rel`` (all of it when None) from the first replica (of ``order``)
        that answers well in time; a replica that fails moves down for reads of ``kind``. :class:`RaceLost` when
        none does. ``small``: a read before any other of this process (:func:`start_small_read`)."""
        self._fresh()
        tries = self.health.tries(order, exclude)
        pools = self._pool()
        start, end = span if span is not None else (None, None)

        def begin(i: int) -> Future[bytes]:
            try:
                if small:
                    return start_small_read(self._location(i), rel, start, end, pools.io)
                return start_read(self._location(i), rel, start, end, pools.io, pools.direct)
            except Exception as exc:  # noqa: BLE001 — an unusable URL fails its attempt, not the race
                fut: Future[bytes] = Future()
                fut.set_exception(exc)
                return fut

        spare = tries[0] if len(tries) == 1 else None
        return race(tries, begin, check, self.health, nbytes=nbytes, kind=kind, spare=spare)

    def scrub(self, text: str) -> str:
        """``text`` (e.g. a storage library's error, which may quote a URL whole) with every replica URL as
        :func:`shown` prints it and their credentials left out."""
        for url, name in zip(self.urls, self.names, strict=True):
            if url != name:
                text = text.replace(url, name)
                for secret in _secrets(url):
                    text = text.replace(secret, "***")
        return text

    def _lost(self, lost: RaceLost) -> str:
        return self.scrub("; ".join(f"{self.names[i]}: {text}" for i, text in lost.errors))

    def read_range(
        self, path_or_info: str | ShardInfo, start: int, length: int, *, check: Callable[[bytes], None] | None = None
    ) -> bytes:
        """Bytes ``[start, start + length)`` of a stored object (a shard, by its row or relative path), from
        the first replica that has them, with deadlines and hedging. Exactly ``length`` bytes or an error:
        ShardMissingError when no replica has the object, StorageError when none answered in time.
        ``check`` (e.g. the digests of the frames read) raises on bytes that are not the ones wanted: that
        answer is refused like a failed one and the next replica (or a hedged answer) is taken instead."""
        rel = path_or_info.path if isinstance(path_or_info, ShardInfo) else path_or_info
        if start < 0 or length < 0:
            raise UsageError(f"read_range of {rel}: start and length must be non-negative, got {start}, {length}")
        if length == 0:
            return b""

        def exact(i: int, data: bytes) -> None:
            self._ranged(i, rel, start, start + length, data)
            if len(data) < length:
                raise ShardError(rel, f"{self.names[i]} returned {len(data)} of bytes [{start}, {start + length})")
            if check is not None:
                check(data)

        info = path_or_info if isinstance(path_or_info, ShardInfo) and check is not None else None
        if info is not None and self.arrived is not None and check is not None:
            have = self.arrived.wait(info, start, start + length)  # a span a fill asks for now comes with it
            data = self.arrived.read(info, start, start + length, have)
            if data is not None:
                try:
                    check(data)
                    return data
                except (ShardError, ManifestError, ValueError):  # not the bytes wanted: a replica's are read instead
                    pass
        try:
            shards = self.health.order(SHARDS)
            i, data = self._read(rel, (start, start + length), length, shards, kind=SHARDS, check=exact)
            if info is not None and self.arrived is not None and not self.local(i):
                self.arrived.keep(info, start, data)
            return data
        except RaceLost as lost:
            if lost.missing == len(lost.errors):
                raise ShardMissingError(rel, "no replica has it: " + self._lost(lost)) from None
            raise StorageError(f"cannot read bytes [{start}, {start + length}) of {rel}: {self._lost(lost)}") from None

    def _ranged(self, i: int, rel: str, start: int, end: int, data: bytes) -> None:
        """ShardError unless the answer to a read of bytes ``[start, end)`` is at most ``end - start`` bytes:
        a server without Range support answers each with the whole object."""
        if len(data) > end - start:
            raise ShardError(
                rel,
                f"{self.names[i]} answered a read of bytes [{start}, {end}) with {len(data)} bytes: it ignores Range "
                "requests (serve the dataset from a server or store that supports them)",
            )

    # --- manifests ------------------------------------------------------------------------------------------

    def load_manifest(self, version: str | None = None) -> Manifest:
        """The manifest from the first replica that serves a valid one (in time)."""
        rel = MANIFEST_FILE if version is None else version_path(version)
        first = self.health.order(MANIFESTS)
        try:
            i, header = self._read(
                rel, (0, _MANIFEST_HINT), _MANIFEST_HINT, first, kind=MANIFESTS, check=self._header, small=True
            )
        except RaceLost as lost:
            if lost.missing == len(lost.errors):
                what = (
                    f"no ferry dataset at any of {self.names}"
                    if version is None
                    else f"version {version} is not published at any of {self.names}"
                )
                raise DatasetNotFoundError(f"{what}: {self._lost(lost)}") from None
            raise DatasetError(f"cannot read the dataset manifest from any replica: {self._lost(lost)}") from None
        if len(header) == _MANIFEST_HINT:  # longer than the hint: read it whole from the same replica
            order = [i, *[j for j in self.health.order(MANIFESTS) if j != i]]
            check = self._header_whole
            try:
                i, header = self._read(rel, None, _MANIFEST_HINT, order, kind=MANIFESTS, check=check)
            except RaceLost as lost:
                raise DatasetError(f"cannot read the dataset manifest from any replica: {self._lost(lost)}") from None
        table = Manifest.parse_header(header)["shard_table"]
        if self.cache_dir is None or not table["bytes"]:
            return Manifest.from_json(header, self._shard_table(table, i))
        return Manifest.from_json(header, cached_table(self.cache_dir, table, lambda: self._shard_table(table, i)))

    def _shard_table(self, table: Mapping[str, Any], first: int) -> bytes:
        """The bytes of the manifest's shard table, checked against its size and digest, from replica ``first``
        (the one that served the manifest) or the next that has it."""

        def matches(_i: int, data: bytes) -> None:
            if len(data) != table["bytes"] or digest_bytes(data) != table["digest"]:
                raise ManifestError(f"shard table {table['path']} does not match its digest in the manifest")

        order = [first, *[j for j in self.health.order(MANIFESTS) if j != first]]
        span, size = (0, table["bytes"]), table["bytes"]
        if not size:
            return b""
        try:
            return self._read(table["path"], span, size, order, kind=MANIFESTS, check=matches)[1]
        except RaceLost as lost:
            raise ManifestError(
                f"cannot read the shard table {table['path']} named by the manifest: {self._lost(lost)}"
            ) from None

    @staticmethod
    def _header_whole(_i: int, data: bytes) -> None:
        Manifest.parse_header(data)

    @staticmethod
    def _header(_i: int, data: bytes) -> None:
        """A manifest header is read as its first ``_MANIFEST_HINT`` bytes (a ranged GET: s3fs sends no HEAD
        first); one that fills them is checked when read again whole."""
        if len(data) < _MANIFEST_HINT:
            Manifest.parse_header(data)

    # --- shards ---------------------------------------------------------------------------------------------

    def fetch(self, info: ShardInfo) -> bytes:
        """The verified raw (decompressed) bytes of a shard, from the first replica that has a good copy."""
        out = io.BytesIO()
        self.fetch_into(info, out)
        return out.getvalue()

    def fetch_into(self, info: ShardInfo, out: BinaryIO) -> None:
        """Stream a shard's verified raw bytes into ``out`` (a file opened ``wb+``), as parallel ranged reads (the
        only replica, on a local disk, read by this thread: :meth:`_stream_here`).

        A copy that fails a check is read again from the other replicas (those that served it are left out
        for this shard only: a partial replica keeps serving its other shards), up to once per replica."""
        errors: list[str] = []
        kinds: set[type[ShardError]] = set()
        served: set[int] = set()
        splice = True  # after a failed check, bytes kept on the node are not trusted again for this shard
        for _ in range(len(self.urls) + 1):
            # a failed round's bytes go; an empty file is left alone (ext4 writes a truncated file's pages back
            # when it is closed, in this thread)
            if out.seek(0, os.SEEK_END):
                out.seek(0)
                out.truncate()
            used: set[int] = set()
            try:
                self._stream(info, out, frozenset(served), used, splice=splice)
                COUNTERS.add("cache", "shards_fetched", 1)
                return
            except ShardError as exc:
                if self.arrived is not None:
                    self.arrived.drop(info)  # bytes from it may be the bad ones: the next round reads replicas
                    splice = False  # even if something writes them again meanwhile
                errors.append(self.scrub(f"{'+'.join(self.names[i] for i in sorted(used))}: {exc}"))
                kinds.add(type(exc))
            except RaceLost as lost:
                errors.append(self._lost(lost))
                kinds.add(ShardMissingError)
                if lost.missing == len(lost.errors) or not used:
                    break  # nobody has it (or nobody answered): another round changes nothing
            served |= used  # the next round asks the others first (all again when none is left)
        kind = kinds.pop() if len(kinds) == 1 else ShardMissingError
        raise kind(info.path, "no replica has a good copy: " + "; ".join(errors))

    def _stream_here(self, info: ShardInfo, out: BinaryIO, used: set[int]) -> bool:
        """The shard read from the dataset's only replica, on a local disk (:meth:`direct`), by this thread: its
        :class:`ShardSink` pulls the file's parts (:meth:`ShardSink.drain`). A race has no other replica to hedge
        to and no wait to bound, and handing each part over from a fetch thread costs this thread's time (a cold
        epoch of local shards waits on these fetches). False, with ``out`` emptied, when the file cannot be opened
        or read (the race then reads it, and reports what fails); a ShardError when its bytes fail a check or it
        is not a regular file."""
        started = time.monotonic()
        used.add(0)
        try:  # a FIFO or device in the shard's place is a ShardFormatError, raised at once
            f = os.fdopen(open_regular(self._location(0).full(info.path), info.path), "rb", buffering=0)
        except OSError:  # the race reads it (in time, or names why it cannot)
            return False
        sink = ShardSink(info, out)
        try:
            with f:
                try:
                    sink.drain(f)
                except SourceFailed:  # the file's read failed (the cache file's writes raise as they are)
                    out.seek(0)
                    out.truncate()
                    return False
            sink.finish()
        except ShardError:
            self.health.refused(0, sink.stored.nbytes, time.monotonic() - started, SHARDS)
            raise
        self.health.answered(0, info.stored_bytes, time.monotonic() - started)
        return True

    def _part(
        self, info: ShardInfo, a: int, b: int, exclude: frozenset[int], shared: ArrivedBytes | None
    ) -> tuple[int, bytes]:
        """Stored bytes ``[a, b)`` of a shard being fetched whole, from the first replica that answers well in time
        (and kept on the node, ``shared``, for the frame reads of other processes while the fill runs)."""

        def ranged(i: int, data: bytes) -> None:
            self._ranged(i, info.path, a, b, data)

        order = self.health.order(SHARDS)
        i, data = self._read(info.path, (a, b), b - a, order, kind=SHARDS, check=ranged, exclude=exclude)
        if shared is not None and not self.local(i):
            shared.keep(info, a, data)
        return i, data

    def _stream(
        self, info: ShardInfo, out: BinaryIO, exclude: frozenset[int], used: set[int], *, splice: bool = True
    ) -> None:
        """One pass over the shard: parts read ``connections`` at a time, fed in order to a :class:`ShardSink`;
        from the only replica of a dataset, on a local disk, read in this thread (:meth:`_stream_here`).
        ``splice``: take the bytes that arrived on the node (:mod:`ferry.client.fetching.arrived`) from there."""
        if self.direct() and self._stream_here(info, out, used):
            return
        size, part = info.stored_bytes, self.fetch_options.part_size
        spans = [(a, min(a + part, size)) for a in range(0, size, part)]
        if spans:  # one byte past the end: a longer object than the manifest says is caught by the sink
            spans[-1] = (spans[-1][0], size + 1)
        sink = ShardSink(info, out)
        pools = self._pool()
        # parts of the shard read now first, then of the shards fetched for later, each shard in the order its
        # fetch started and its parts in order: the shard needed first ends first instead of all at once
        rank = (int(getattr(self._later, "depth", 0) > 0), next(self._tickets))
        order = itertools.count()
        arrived = self.arrived if splice else None
        # writing every part to the disk costs a fill about a tenth of its time: only for frame reads meanwhile
        shared = self.arrived if self.share_fills else None

        def ask(k: int) -> list[Entry]:
            """The entries of part ``k``: what arrived (frames read meanwhile) from the disk, the rest from replicas."""
            a, b = spans[k]
            have = [] if arrived is None else arrived.spans(info)
            cut = [(a, b, False)] if arrived is None else pieces(a, min(b, size), have)
            out: list[Entry] = []
            for s, e, local in cut:
                if local:
                    out.append((s, e, None, have))
                    continue
                e = b if e == size else e  # to the end: one byte more asked for, as for a part read whole
                if shared is not None:
                    shared.claim(info, s, e)
                out.append(
                    (s, e, pools.parts.submit((*rank, next(order)), self._part, info, s, e, exclude, shared), have)
                )
            return out

        parts = PartQueue(len(spans), self.fetch_options.connections, ask, self._later_limit if rank[0] else None)
        if rank[0]:
            self._later_fills.add(parts)
        with shared.filling(info) if shared is not None else contextlib.nullcontext():
            try:
                while (entry := parts.take()) is not None:
                    s, e, fut, have = entry
                    want = min(e, size) - s
                    data = None if fut is not None or arrived is None else arrived.read(info, s, s + want, have)
                    if fut is not None:
                        i, data = fut.result()
                    elif data is None:  # gone from the disk meanwhile (evicted)
                        i, data = self._part(info, s, e, exclude, shared)
                    else:
                        i = -1
                    if i >= 0:
                        used.add(i)
                    if len(data) < want:
                        raise ShardError(
                            info.path, f"{self.names[i]} returned {len(data)} of {want} bytes at {s} (truncated copy)"
                        )
                    sink.feed(data)
                sink.finish()
            finally:
                parts.stop()


def _urls(urls: Any) -> list[str]:
    """One URL or a non-empty list of them (``str`` or ``os.PathLike``)."""
    many = isinstance(urls, Sequence) and not isinstance(urls, (str, bytes))
    out = [os.fspath(u) if isinstance(u, os.PathLike) else u for u in (urls if many else [urls])]
    if not out or not all(isinstance(u, str) and u.strip() and "\0" not in u for u in out):
        hidden = [shown(u) if isinstance(u, str) else u for u in (urls if many else [urls])]
        raise UsageError(
            f"url must be a dataset URL or a non-empty list of them, got {show(hidden if many else hidden[0])}"
        )
    return out
