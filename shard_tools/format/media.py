"""Media in a shard: the ``media`` column, its items, and where its buffers lie in the raw Arrow file.

A shard of a dataset packed with media has, right after ``tokens``, a column ``media`` of type
``list<struct<position: int32, cost: int32, kind: string, format: string, width: int32, height: int32,
duration: double, frames: int32, data: large_binary>>``: per document, its media items in stream order.
``position`` is the offset in the document's tokens where the item's placeholder span begins and
``cost`` its length (under the manifest's media policy, :mod:`ferry.shard_tools.format.policy`); ``data``
the item's encoded bytes as they came in (JPEG, PNG, WebP, WAV, …). Arrow stores each field's values
of all documents back to back, so the metadata fields lie together, before all of the media bytes, and
one document's bytes are one contiguous range of ``data``'s values: a reader by frames reads the metadata
region of a shard in one ranged read and a sample's media in one more (:func:`media_layout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import ShardFormatError
from .arrays import one_array
from .manifest import ShardInfo
from .policy import MediaPolicy
from .seekable import _HEADER_DICTIONARY_BATCH, _MAX_MESSAGES, _message, _require
from .shard import _HEADER_RECORD_BATCH, _FlatBuffer

__all__ = [
    "MEDIA_COLUMN",
    "MEDIA_TYPE",
    "MediaItem",
    "MediaMeta",
    "MediaLayout",
    "media_array",
    "empty_media",
    "media_layout",
    "binary_offsets",
    "item_offsets",
    "item_arrays",
]

MEDIA_COLUMN = "media"
_META_FIELDS = [
    ("position", pa.int32()),
    ("cost", pa.int32()),
    ("kind", pa.string()),
    ("format", pa.string()),
    ("width", pa.int32()),
    ("height", pa.int32()),
    ("duration", pa.float64()),
    ("frames", pa.int32()),
]
MEDIA_ITEM = pa.struct(_META_FIELDS + [("data", pa.large_binary())])
MEDIA_TYPE = pa.list_(MEDIA_ITEM)
# Arrow IPC buffers of the media column, in order: list validity, list offsets, struct validity, then per field
# its validity and data (a string: validity, offsets, data), the data field last (validity, int64 offsets, bytes).
_NODES = 2 + len(_META_FIELDS) + 1
_BUFFERS = 3 + sum(3 if t == pa.string() else 2 for _, t in _META_FIELDS) + 3
_TOKENS_NODES, _TOKENS_BUFFERS = 2, 4  # the tokens column before it


@dataclass(frozen=True)
class MediaItem:
    """One media item of a document: its encoded bytes, what they are, and its placeholder span."""

    kind: str  # "image", "audio", "video"
    format: str  # "jpeg", "png", "webp", "wav", …
    width: int
    height: int
    duration: float  # seconds (0 for images)
    frames: int  # video frames (0 for images and audio)
    data: bytes
    position: int = 0  # offset of the placeholder span in the document's tokens
    cost: int = 0  # tokens of the placeholder span


_NUMPY: dict[pa.DataType, np.dtype] = {
    pa.int32(): np.dtype("<i4"),
    pa.int64(): np.dtype("<i8"),
    pa.float64(): np.dtype("<f8"),
}


def _numbers(arr: pa.Array) -> np.ndarray:
    """A null-free int32 / int64 / float64 array as numpy, from its data buffer (``to_numpy`` imports pandas:
    a visible part of a loader's cold start)."""
    dtype = _NUMPY[arr.type]
    if len(arr) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _strings(arr: pa.Array) -> list[str]:
    """A null-free (validated) string array as Python strings, from its buffers (as :func:`_numbers`)."""
    if len(arr) == 0:
        return []
    offsets = np.frombuffer(arr.buffers()[1], dtype="<i4", count=len(arr) + 1, offset=arr.offset * 4).tolist()
    data = memoryview(arr.buffers()[2]) if arr.buffers()[2] is not None else memoryview(b"")
    return [str(data[a:b], "utf-8") for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def item_offsets(column: pa.Array) -> np.ndarray:
    """The ``documents + 1`` item offsets of a media column (absolute in its items, slices respected)."""
    return _numbers(column.offsets).astype(np.int64)


def binary_offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` int64 value offsets of a ``large_binary`` array (slices respected)."""
    return np.frombuffer(arr.buffers()[1], dtype="<i8", count=len(arr) + 1, offset=arr.offset * 8).astype(np.int64)


def item_arrays(column: pa.Array) -> list[pa.Array]:
    """The fields of a media column's items (metadata fields in order, ``data`` last), slices respected."""
    items = column.flatten()
    return list(items.flatten())


def empty_media(documents: int) -> pa.Array:
    """A media column of ``documents`` documents without media."""
    return media_array([[] for _ in range(documents)])


def media_array(docs: Sequence[Sequence[MediaItem]]) -> pa.Array:
    """The ``media`` column for documents with these items (one list per document)."""
    offsets = np.zeros(len(docs) + 1, dtype=np.int32)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    items = [item for doc in docs for item in doc]
    fields = [pa.array([getattr(i, name) for i in items], type=t) for name, t in _META_FIELDS]
    fields.append(pa.array([i.data for i in items], type=pa.large_binary()))
    struct = pa.StructArray.from_arrays(fields, fields=list(MEDIA_ITEM))
    return pa.ListArray.from_arrays(pa.array(offsets), struct, type=MEDIA_TYPE)


@dataclass(frozen=True)
class MediaMeta:
    """The media metadata of a shard's documents, as numpy arrays over all its items: document ``d`` has
    items ``[doc_offsets[d], doc_offsets[d + 1])``; item ``j``'s bytes are ``[data_offsets[j],
    data_offsets[j + 1])`` of the ``data`` values."""

    doc_offsets: np.ndarray
    position: np.ndarray
    cost: np.ndarray
    kind: list[str]
    format: list[str]
    width: np.ndarray
    height: np.ndarray
    duration: np.ndarray
    frames: np.ndarray
    data_offsets: np.ndarray

    @property
    def items(self) -> int:
        return len(self.position)

    @property
    def data_bytes(self) -> int:
        return int(self.data_offsets[-1] - self.data_offsets[0]) if len(self.data_offsets) else 0

    def item(self, j: int, data: bytes) -> MediaItem:
        """Item ``j`` with its bytes ``data``."""
        return MediaItem(
            kind=self.kind[j],
            format=self.format[j],
            width=int(self.width[j]),
            height=int(self.height[j]),
            duration=float(self.duration[j]),
            frames=int(self.frames[j]),
            data=data,
            position=int(self.position[j]),
            cost=int(self.cost[j]),
        )

    @classmethod
    def from_column(cls, column: pa.Array | pa.ChunkedArray, shard: str) -> MediaMeta:
        """From a whole shard's (validated) ``media`` column."""
        arr = one_array(column)
        if arr.type != MEDIA_TYPE or arr.null_count or arr.values.null_count:
            raise ShardFormatError(shard, f"the media column is {arr.type} with nulls or of the wrong type")
        offsets = item_offsets(arr)
        fields = item_arrays(arr)
        if any(f.null_count for f in fields):
            raise ShardFormatError(shard, "the media column has null item fields")
        return cls._of(offsets - offsets[0], fields[:-1], binary_offsets(fields[-1]), shard)

    @classmethod
    def _of(cls, doc_offsets: np.ndarray, fields: list[pa.Array], data_offsets: np.ndarray, shard: str) -> MediaMeta:
        values = {name: arr for (name, _), arr in zip(_META_FIELDS, fields, strict=True)}
        meta = cls(
            doc_offsets=np.asarray(doc_offsets, dtype=np.int64),
            position=_numbers(values["position"]).astype(np.int64),
            cost=_numbers(values["cost"]).astype(np.int64),
            kind=_strings(values["kind"]),
            format=_strings(values["format"]),
            width=_numbers(values["width"]),
            height=_numbers(values["height"]),
            duration=_numbers(values["duration"]),
            frames=_numbers(values["frames"]),
            data_offsets=np.asarray(data_offsets, dtype=np.int64),
        )
        meta.check(shard)
        return meta

    def check(self, shard: str, doc_tokens: np.ndarray | None = None) -> None:
        """Offsets in order, costs at least the begin and end tokens, each span inside its document
        (``doc_tokens``: each document's token count, when known), spans in order without overlap."""
        n = len(self.position)
        d, o = self.doc_offsets, self.data_offsets
        if len(d) == 0 or d[0] != 0 or d[-1] != n or np.any(np.diff(d) < 0) or len(o) != n + 1:
            raise ShardFormatError(shard, "the media column's item offsets are out of order")
        if np.any(np.diff(o) < 0) or (n and o[0] < 0):
            raise ShardFormatError(shard, "the media column's byte offsets are out of order")
        if n and (np.any(self.cost < 2) or np.any(self.position < 0)):
            raise ShardFormatError(shard, "a media item has a negative position or a cost below 2")
        ends = self.position + self.cost
        same_doc = np.diff(np.repeat(np.arange(len(d) - 1), np.diff(d))) == 0
        if n > 1 and np.any(same_doc & (self.position[1:] < ends[:-1])):
            raise ShardFormatError(shard, "media spans of a document overlap or are out of order")
        if doc_tokens is not None and n:
            limit = np.repeat(np.asarray(doc_tokens, dtype=np.int64), np.diff(d))
            if np.any(ends > limit):
                raise ShardFormatError(shard, "a media item's placeholder span runs past its document")


@dataclass(frozen=True)
class MediaLayout:
    """Where the media column's buffers lie in a raw shard: ``(position, length)`` of each, in order."""

    buffers: tuple[tuple[int, int], ...]
    documents: int
    items: int

    @property
    def meta_range(self) -> tuple[int, int]:
        """Raw bytes holding the item offsets and every metadata field (and the byte offsets), not the bytes."""
        return self.buffers[1][0], self.buffers[22][0] + self.buffers[22][1]

    @property
    def data_pos(self) -> int:
        return self.buffers[23][0]

    def decode(self, region: bytes | memoryview, shard: str) -> MediaMeta:
        """The metadata from the raw bytes of :attr:`meta_range`, checked (Arrow's full validation)."""
        base = self.meta_range[0]
        buf = pa.py_buffer(region)

        def piece(k: int) -> pa.Buffer:
            pos, length = self.buffers[k]
            if not 0 <= pos - base <= pos - base + length <= len(buf):
                raise ShardFormatError(shard, "a media metadata buffer lies outside the media column's metadata")
            return buf.slice(pos - base, length)

        fields: list[pa.Array] = []
        k = 3
        try:
            for _, t in _META_FIELDS:
                parts = [None, piece(k + 1)] + ([piece(k + 2)] if t == pa.string() else [])
                arr = pa.Array.from_buffers(t, self.items, parts)
                arr.validate(full=True)
                fields.append(arr)
                k += len(parts)
            doc_offsets = pa.Array.from_buffers(pa.int32(), self.documents + 1, [None, piece(1)])
            data_offsets = pa.Array.from_buffers(pa.int64(), self.items + 1, [None, piece(22)])
        except (pa.ArrowException, ValueError) as exc:
            raise ShardFormatError(shard, f"the media column's metadata is unreadable ({exc})") from exc
        meta = MediaMeta._of(_numbers(doc_offsets), fields, _numbers(data_offsets), shard)
        if int(meta.data_offsets[-1]) > self.buffers[23][1]:
            raise ShardFormatError(shard, "the media column's byte offsets run past its bytes")
        return meta


def media_layout(head: bytes | memoryview, info: ShardInfo) -> MediaLayout | None:
    """The media column's buffers from the head of a raw shard (raw bytes up to the record batch's body:
    ``[0, index.offsets_pos)``), checked to lie inside the body; None when the shard has no media column."""
    fb = _FlatBuffer(memoryview(head).cast("B"), info.path)
    start, length, _, _ = _message(fb, 8)
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(fb.data[8 : start + length])))
    except (pa.ArrowException, OSError) as exc:
        raise ShardFormatError(info.path, f"unreadable Arrow schema ({exc})") from exc
    if len(schema) < 2 or schema.field(1).name != MEDIA_COLUMN:
        return None
    if schema.field(1).type != MEDIA_TYPE:
        raise ShardFormatError(info.path, f"the media column is {schema.field(1).type}, expected {MEDIA_TYPE}")
    body = 0
    for _ in range(_MAX_MESSAGES):
        start, length, kind, body = _message(fb, start + length + body)
        if kind == _HEADER_RECORD_BATCH:
            break
        if kind != _HEADER_DICTIONARY_BATCH:
            raise ShardFormatError(info.path, f"unexpected Arrow message of type {kind} before the record batch")
    else:
        raise ShardFormatError(info.path, "no record batch at the head of the shard")
    body_start = start + length
    meta = _FlatBuffer(fb.data[start:body_start], info.path)
    batch = meta.deref(_require(meta, meta.deref(0), 2))
    nodes, n_nodes = meta.vector(_require(meta, batch, 1))
    buffers, n_buffers = meta.vector(_require(meta, batch, 2))
    if n_nodes < _TOKENS_NODES + _NODES or n_buffers < _TOKENS_BUFFERS + _BUFFERS:
        raise ShardFormatError(info.path, "the record batch has too few nodes or buffers for its media column")
    lengths = [meta.read("<q", nodes + 16 * (_TOKENS_NODES + i)) for i in range(_NODES)]
    nulls = [meta.read("<q", nodes + 16 * (_TOKENS_NODES + i) + 8) for i in range(_NODES)]
    items = lengths[1]
    if lengths[0] != info.documents or any(nulls) or any(n != items for n in lengths[2:]):
        raise ShardFormatError(info.path, f"the media column's lengths {lengths} disagree with its documents")
    spans = []
    for i in range(_BUFFERS):
        at = buffers + 16 * (_TOKENS_BUFFERS + i)
        offset, size = meta.read("<q", at), meta.read("<q", at + 8)
        if offset < 0 or size < 0 or offset + size > body or body_start + offset + size > info.raw_bytes:
            raise ShardFormatError(info.path, "a media buffer lies outside the record batch's body")
        spans.append((body_start + offset, size))
    return MediaLayout(tuple(spans), info.documents, items)


def check_shard_media(
    table: pa.Table, tokens: np.ndarray, offsets: np.ndarray, info: ShardInfo, policy: MediaPolicy | None
) -> None:
    """A whole shard's media against its manifest row and policy (``ferry verify``): the column is there exactly
    when the dataset has a media policy, its items and bytes are the row's, and each item's span in its
    document holds the policy's placeholder ids (begin, patches, end)."""
    has = MEDIA_COLUMN in table.schema.names
    if policy is None:
        if has or info.media_items or info.media_bytes:
            raise ShardFormatError(info.path, "holds media but the manifest has no media policy")
        return
    if not has or table.schema.get_field_index(MEDIA_COLUMN) != 1:
        raise ShardFormatError(info.path, "the dataset has a media policy but the shard no media column after tokens")
    meta = MediaMeta.from_column(table.column(MEDIA_COLUMN), info.path)
    meta.check(info.path, np.diff(offsets))
    if (meta.items, meta.data_bytes) != (info.media_items, info.media_bytes):
        raise ShardFormatError(
            info.path,
            f"holds {meta.items} media items of {meta.data_bytes} bytes, the manifest says "
            f"{info.media_items} of {info.media_bytes}",
        )
    if not meta.items:
        return
    begin_id, patch_id, end_id = policy.ids
    docs = np.repeat(np.arange(len(offsets) - 1), np.diff(meta.doc_offsets))
    starts = np.asarray(offsets, dtype=np.int64)[docs] + meta.position
    ends = starts + meta.cost
    patches = np.concatenate([[0], np.cumsum(tokens == patch_id)])
    if (
        np.any(tokens[starts] != begin_id)
        or np.any(tokens[ends - 1] != end_id)
        or np.any(patches[ends - 1] - patches[starts + 1] != meta.cost - 2)
    ):
        raise ShardFormatError(info.path, "a media item's placeholder span does not hold the policy's token ids")
