"""One unit of packing work: read documents, append EOS, cut into shards, encode, store.

This is what a pack worker runs — in-process, in a process pool, as a Ray task or on one
node of a ``--part I/N`` run. It is a function of the unit and the job alone, so every
executor produces the same shards. Shards are stored under their content digest.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FerryError, ShardError, StorageError, TokenRangeError
from ..format.digest import digest_bytes, raw_digest
from ..format.header import SHARDS_DIR
from ..format.manifest import ShardInfo
from ..format.media import MEDIA_COLUMN, binary_offsets, empty_media, item_arrays, item_offsets
from ..format.seekable import (
    DEFAULT_FRAME_SIZE,
    SHARD_SUFFIX_2,
    SHARD_SUFFIX_3,
    arrow_positions,
    decode_frames,
    encode_shard_frames,
    find_index,
    parse_index,
)
from ..format.shard import SHARD_SUFFIX, compress, decompress, encode_shard_buffer
from ..sources import DocBatch, SourceOptions, Unit, read_unit
from ..storage.store import Location, link_new, resolve, storage_error, write_temp_beside
from ..threadname import start_named_thread

__all__ = [
    "Job",
    "UnitResult",
    "pack_unit",
    "pack_batches",
    "cut_shards",
    "assemble",
    "with_eos",
    "check_range",
    "store_immutable",
    "create_object",
    "describe_stored",
]


@dataclass(frozen=True)
class Job:
    """What one worker needs: picklable, no open handles."""

    out_url: str
    storage_options: dict[str, Any]
    source: SourceOptions
    dtype: str
    vocab_size: int
    eos_id: int | None  # appended to each document when not None
    level: int
    stored_format: int = 1  # 1: one zstd frame; 2, 3: seekable frames + frame index (shard_tools.format.seekable)
    frame_size: int = DEFAULT_FRAME_SIZE  # raw bytes per frame in formats 2 and 3
    prefetch: bool = field(default=True, compare=False)  # read the next batch while compressing


@dataclass(frozen=True)
class UnitResult:
    """The shards one unit produced, in order."""

    shards: list[ShardInfo]
    documents: int
    tokens: int
    skipped_media: int = 0  # bad media items left out (--skip-bad-media)


def cut_shards(
    batches: Iterable[DocBatch],
    budget: int,
    itemsize: int,
    *,
    eos_id: int | None = None,
    dtype: str | None = None,
) -> Iterator[DocBatch]:
    """Regroup document batches (without EOS) into shards: cut at the first document boundary
    where the raw size — tokens (plus one EOS each when ``eos_id`` is set) times ``itemsize``,
    plus 4 offset bytes per document — reaches ``budget``; a document is never split. Each
    shard is assembled with EOS inserted in one copy, as ``dtype`` (default: the input's)."""
    per_doc = 4 + (itemsize if eos_id is not None else 0)
    for parts in _groups(batches, budget, itemsize, per_doc):
        yield assemble(parts, eos_id, dtype or parts[0].tokens.dtype.name)


def _groups(batches: Iterable[DocBatch], budget: int, itemsize: int, per_doc: int) -> Iterator[list[DocBatch]]:
    parts: list[DocBatch] = []
    used = 0
    for batch in batches:
        pos = 0
        ndocs = len(batch.offsets) - 1
        media = _media_bytes(batch)
        while pos < ndocs:
            # raw bytes after taking documents pos..k: (offsets[k+1]-offsets[pos])*itemsize + per_doc*(k+1-pos)
            rel = (batch.offsets[pos + 1 :] - batch.offsets[pos]) * itemsize + per_doc * np.arange(1, ndocs - pos + 1)
            if media is not None:  # and the documents' media bytes
                rel = rel + (media[pos + 1 :] - media[pos])
            k = int(np.searchsorted(rel, budget - used, side="left"))
            if k >= ndocs - pos:  # the whole rest stays below the budget
                parts.append(_slice(batch, pos, ndocs))
                used += int(rel[-1])
                break
            end = pos + k + 1
            parts.append(_slice(batch, pos, end))
            yield parts
            parts, used = [], 0
            pos = end
    if parts:
        yield parts


def _media_bytes(batch: DocBatch) -> np.ndarray | None:
    """Cumulative media bytes before each document of a batch with media (None without)."""
    if batch.media is None:
        return None
    items = item_offsets(batch.media)
    data = binary_offsets(item_arrays(batch.media)[-1])
    at = data[items - items[0]]
    return at - at[0]


def _slice(batch: DocBatch, a: int, b: int) -> DocBatch:
    lo, hi = batch.offsets[a], batch.offsets[b]
    rows = None if batch.rows is None else batch.rows[a:b]
    media = None if batch.media is None else batch.media.slice(a, b - a)
    skipped = batch.skipped_media if a == 0 else 0  # counted once, with the batch's first slice
    return DocBatch(batch.tokens[lo:hi], batch.offsets[a : b + 1] - lo, rows, media, skipped)


def assemble(parts: list[DocBatch], eos_id: int | None, dtype: str) -> DocBatch:
    """Concatenate document batches into one, as ``dtype``, appending ``eos_id`` to every
    document when given — a single copy into a buffer allocated once."""
    ndocs = sum(len(p.offsets) - 1 for p in parts)
    ntokens = sum(int(p.offsets[-1] - p.offsets[0]) for p in parts) + (ndocs if eos_id is not None else 0)
    out = np.empty(ntokens, dtype=np.dtype(dtype))
    offsets = np.empty(ndocs + 1, dtype=np.int64)
    offsets[0] = 0
    t = d = 0
    for p in parts:
        k = len(p.offsets) - 1
        src = p.offsets - p.offsets[0]
        local = src if eos_id is None else src + np.arange(k + 1, dtype=np.int64)
        n = int(local[-1])
        if eos_id is None:
            out[t : t + n] = p.tokens[p.offsets[0] : p.offsets[-1]]
        else:
            _copy_with_eos(out[t : t + n], p.tokens[p.offsets[0] : p.offsets[-1]], src, local, eos_id)
        offsets[d + 1 : d + k + 1] = local[1:] + t
        t += n
        d += k
    rows = None if any(p.rows is None for p in parts) else np.concatenate([p.rows for p in parts])
    media = None
    if any(p.media is not None for p in parts):
        if any(p.media is None for p in parts):
            raise ShardError("<new>", "some documents of a shard have a media column and some have none")
        media = pa.concat_arrays([p.media for p in parts])
    return DocBatch(out, offsets, rows, media, sum(p.skipped_media for p in parts))


def _copy_with_eos(dst: np.ndarray, tokens: np.ndarray, src: np.ndarray, local: np.ndarray, eos_id: int) -> None:
    k = len(src) - 1
    ends = local[1:] - 1
    if k and tokens.shape[0] >= 256 * k:  # long documents: one slice copy each beats a boolean mask
        s, q = src.tolist(), local.tolist()
        for i in range(k):
            dst[q[i] : q[i + 1] - 1] = tokens[s[i] : s[i + 1]]
    else:
        keep = np.ones(dst.shape[0], dtype=bool)
        keep[ends] = False
        dst[keep] = tokens
    dst[ends] = eos_id


def with_eos(batch: DocBatch, eos_id: int, dtype: str) -> DocBatch:
    """Append ``eos_id`` to every document, converting to the shard dtype in the same copy."""
    return assemble([batch], eos_id, dtype)


def check_range(batch: DocBatch, vocab_size: int, where: str, first_document: int = 0) -> None:
    """Raise TokenRangeError naming the document (numbered from ``first_document``, the batch's
    first) if any id is negative or ≥ ``vocab_size``."""
    if batch.tokens.size == 0:
        return
    lo, hi = int(batch.tokens.min()), int(batch.tokens.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        pos = int(np.flatnonzero(batch.tokens == bad)[0])
        doc = first_document + int(np.searchsorted(batch.offsets, pos, side="right")) - 1
        raise TokenRangeError(f"{where}: token id {bad} in document {doc} is outside the vocabulary [0, {vocab_size})")


@lru_cache(maxsize=8)
def _location(url: str, options_key: str) -> Location:
    import json

    return resolve(url, json.loads(options_key))


def _out(job: Job) -> Location:
    import json

    return _location(job.out_url, json.dumps(job.storage_options, sort_keys=True, default=str))


def origin_columns(batch: DocBatch, origin: str | None) -> dict[str, pa.Array]:
    """Columns ``origin_file`` (the input file, dictionary-encoded: one string per shard) and ``origin_row``
    (each document's row/line in it), when the documents have a file and rows."""
    if origin is None or batch.rows is None:
        return {}
    n = len(batch.offsets) - 1
    files = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([origin]))
    return {"origin_file": files, "origin_row": pa.array(np.asarray(batch.rows, dtype=np.int64))}


def store_shard(job: Job, batch: DocBatch, origin: str | None = None) -> ShardInfo:
    """Encode, compress and store one shard under its raw digest; returns its manifest row. With
    ``origin`` (the input file) and the batch's rows, the shard records where each document came from."""
    extra = {}
    if job.source.media is not None:  # the media column comes right after tokens (format.media)
        extra[MEDIA_COLUMN] = batch.media if batch.media is not None else empty_media(len(batch.offsets) - 1)
    extra.update(origin_columns(batch, origin) if job.source.origin else {})
    buffer = encode_shard_buffer(batch.tokens, batch.offsets, job.dtype, extra)
    raw = memoryview(buffer)
    index_bytes, index_digest, frame_size = 0, "", 0
    stored: bytes | tuple[bytes, ...]
    if job.stored_format in (2, 3):
        encoded = encode_shard_frames(buffer, job.level, job.frame_size, job.stored_format)
        stored, stored_bytes, stored_digest = encoded.pieces, encoded.stored_bytes, encoded.stored_digest
        index_bytes, index_digest, raw_hex = encoded.index_bytes, encoded.index_digest, encoded.raw_digest
        frame_size = job.frame_size if job.stored_format == 3 else 0
    else:
        stored = compress(raw, job.level)
        stored_bytes, stored_digest, raw_hex = len(stored), digest_bytes(stored), digest_bytes(raw)
    # the stored format is in the name: several forms of the same content may live in one dataset's history
    suffix = {2: SHARD_SUFFIX_2, 3: SHARD_SUFFIX_3}.get(job.stored_format, SHARD_SUFFIX)
    info = ShardInfo(
        path=f"{SHARDS_DIR}/{raw_hex.split(':', 1)[1]}{suffix}",
        documents=len(batch.offsets) - 1,
        tokens=int(batch.offsets[-1]),
        stored_bytes=stored_bytes,
        raw_bytes=len(raw),
        stored_digest=stored_digest,
        raw_digest=raw_hex,
        index_bytes=index_bytes,
        index_digest=index_digest,
        frame_size=frame_size,
        **(_media_counts(extra[MEDIA_COLUMN]) if MEDIA_COLUMN in extra else {}),
    )
    return store_immutable(_out(job), info, stored)


def _media_counts(column: pa.Array) -> dict[str, int]:
    """The manifest row's media totals of a shard's media column."""
    data = item_arrays(column)[-1]
    return {"media_items": len(data), "media_bytes": int(pc.sum(pc.binary_length(data)).as_py() or 0)}


def store_immutable(loc: Location, info: ShardInfo, stored: bytes | tuple[bytes, ...]) -> ShardInfo:
    """Store a shard's bytes at ``info.path`` unless an object is already there; returns the row that
    describes what is stored.

    A shard object, once stored, is never rewritten: versions already published may name it with
    its stored size and digests. When the name is taken by the same raw content in other stored
    bytes (another zstd level, frame size), that object is reused and the row describes it. When it
    holds anything else (a damaged or foreign object), this shard goes to a second name that carries
    its stored digest, ``shards/<raw>.<stored><suffix>``."""
    if create_object(loc, info.path, stored):
        return info
    if _existing_size(loc, info.path) <= _stored_bound(info.raw_bytes):  # else not this content: not read
        existing = _read_existing(loc, info.path)
        if len(existing) == info.stored_bytes and digest_bytes(existing) == info.stored_digest:
            return info
        adopted = describe_stored(existing, info)
        if adopted is not None:
            return adopted
    head, _, name = info.path.rpartition("/")
    raw_hex, dot, suffix = name.partition(".")
    other = replace(info, path=f"{head}/{raw_hex}.{info.stored_digest.split(':', 1)[1]}{dot}{suffix}")
    if create_object(loc, other.path, stored):
        return other
    again = _read_existing(loc, other.path)
    if len(again) == info.stored_bytes and digest_bytes(again) == info.stored_digest:
        return other
    raise StorageError(
        f"{loc.url}/{info.path} and {other.path} both hold other bytes than this shard; shard objects are never "
        "rewritten: remove them if no version names them, then pack again",
        retryable=False,
    )


def _stored_bound(raw_bytes: int) -> int:
    """More than any stored form of ``raw_bytes`` raw bytes can take (zstd's worst case is n + n/256 plus a
    little per frame; frames are at least 4 KiB; the frame index takes 24 bytes a frame)."""
    return raw_bytes + raw_bytes // 64 + (raw_bytes // 4096 + 1) * 128 + 65536


def _existing_size(loc: Location, rel: str) -> int:
    try:
        return loc.size(rel)
    except FileNotFoundError:  # removed between the failed create and this look: a racing delete
        raise StorageError(f"{loc.url}/{rel} vanished while packing; pack again") from None


def _read_existing(loc: Location, rel: str) -> bytes:
    try:
        return loc.read_bytes(rel)
    except FileNotFoundError:  # removed between the failed create and this read: a racing delete
        raise StorageError(f"{loc.url}/{rel} vanished while packing; pack again") from None


def describe_stored(stored: bytes, info: ShardInfo) -> ShardInfo | None:
    """The row of ``stored`` (whole stored bytes in ``info``'s format) when it holds exactly the raw
    content ``info`` describes, every frame and position checked (in format 3 every frame against its leaf
    and the leaves against the raw digest, at ``info``'s frame size); None when it does not."""
    view = memoryview(stored)
    try:
        if info.index_bytes:
            size = find_index(view, info.path)
            if size > len(view):
                return None
            index = parse_index(view[len(view) - size :], shard=info.path, stored_bytes=len(view),
                                raw_bytes=info.raw_bytes, version=info.stored_format)  # fmt: skip
            if index.version == 3 and (index.frame_size, index.root(info.raw_bytes)) != (
                info.frame_size,
                info.raw_digest,
            ):
                return None
            raw = decode_frames(view, index, info.raw_bytes, info.path)
            if arrow_positions(pa.py_buffer(raw)) != (index.offsets_pos, index.tokens_pos):
                return None
            index_bytes, index_digest = size, digest_bytes(view[len(view) - size :])
        else:
            raw = decompress(view, info.raw_bytes, info.path)
            index_bytes, index_digest = 0, ""
    except ShardError:
        return None
    if len(raw) != info.raw_bytes or raw_digest(raw, info.frame_size) != info.raw_digest:
        return None
    return replace(
        info,
        stored_bytes=len(stored),
        stored_digest=digest_bytes(stored),
        index_bytes=index_bytes,
        index_digest=index_digest,
    )


def create_object(loc: Location, rel: str, data: bytes | tuple[bytes, ...]) -> bool:
    """Write ``data`` at ``rel`` only if no object is there, atomically (never check-then-write where
    the store can do better): True when stored, False when an object already was (left untouched).

    Local disks: a fsync'ed temp file hard-linked to the name (``link`` fails if the name exists);
    object stores and ``memory://``: a create-only write (S3 ``If-None-Match: *``)."""
    path = loc.full(rel)
    try:
        if loc.local:
            return _link_new(path, data)
        loc.fs.pipe_file(path, b"".join(data) if isinstance(data, tuple) else bytes(data), mode="create")
        return True
    except FileExistsError:
        return False
    except FerryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
        if _precondition_failed(exc):
            return False
        raise storage_error(f"cannot write {loc.url}/{rel}: {exc}", exc) from exc


def _precondition_failed(exc: BaseException) -> bool:
    """An S3 refusal of a create-only PUT because the key exists (412, or 409 while another create runs)."""
    for e in (exc, exc.__cause__, exc.__context__):
        response: Any = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code") or "")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)
    return False


def _link_new(path: str, data: bytes | tuple[bytes, ...]) -> bool:
    """A whole, fsync'ed file at ``path`` only if nothing is there (a temp file, then :func:`link_new`)."""
    tmp = write_temp_beside(path, data)
    try:
        return link_new(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def pack_batches(
    job: Job, batches: Iterable[DocBatch], where: str, first_document: int = 0, origin: str | None = None
) -> UnitResult:
    """Pack a stream of document batches (without EOS) into stored shards; errors number the
    documents from ``first_document``. With ``origin`` (the input file) each shard records the
    file and each document's row (the reader's, else its number in the file from ``first_document``)."""
    itemsize = np.dtype(job.dtype).itemsize
    record = origin is not None and job.source.origin

    def checked() -> Iterator[DocBatch]:
        doc = first_document
        for batch in batches:
            check_range(batch, job.vocab_size, where, doc)  # before any narrowing cast to the shard dtype
            k = len(batch.offsets) - 1
            if record and batch.rows is None:
                batch = batch._replace(rows=np.arange(doc, doc + k, dtype=np.int64))
            doc += k
            yield batch

    source = _prefetch(checked()) if job.prefetch else checked()
    cuts = cut_shards(source, job.source.shard_size, itemsize, eos_id=job.eos_id, dtype=job.dtype)
    shards, skipped = [], 0
    for b in cuts:
        shards.append(store_shard(job, b, origin if record else None))
        skipped += b.skipped_media
    return UnitResult(shards, sum(s.documents for s in shards), sum(s.tokens for s in shards), skipped)


def unit_label(unit: Unit) -> str:
    """How errors name a unit: the file, plus which part of it for a split input whose documents
    cannot be numbered in the whole file (Megatron ranges, byte ranges, zstd frames)."""
    if unit.stop is None or unit.first_document is not None:
        return unit.path
    if unit.span == "documents":
        return f"{unit.path}[{unit.start}:{unit.stop}]"
    what = "bytes" if unit.span == "bytes" else "compressed bytes"
    return f"{unit.path} (the part at {what} {unit.start}-{unit.stop}, documents numbered from its start)"


def _first_document(unit: Unit) -> int:
    if unit.first_document is not None:
        return unit.first_document
    return unit.start if unit.span == "documents" else 0


def pack_unit(job: Job, unit: Unit) -> UnitResult:
    """Pack one unit of input into stored shards (the function every executor runs)."""
    return pack_batches(job, read_unit(unit, job.source), unit_label(unit), _first_document(unit), origin=unit.path)


_DONE = object()


def _prefetch(items: Iterator[DocBatch], depth: int = 2) -> Iterator[DocBatch]:
    """Run ``items`` in a helper thread, ``depth`` ahead: decoding the input (Parquet, zstd,
    JSON) overlaps compressing the previous shard, both of which release the GIL."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer went away

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)

    thread = start_named_thread(produce, "ferry-prefetch")
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
