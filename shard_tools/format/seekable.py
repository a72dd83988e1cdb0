"""Stored formats 2 and 3: independently compressed zstd frames and a frame index, both directions.

The raw shard (the Arrow IPC file of :mod:`ferry.shard_tools.format.shard`) is unchanged; only its stored form
differs from format 1 (one zstd frame). A format-2 or format-3 stored shard is (integers little-endian)::

    frame 0 | frame 1 | ... | frame n-1 | index

- frame ``k``: one zstd frame, content size recorded, of raw bytes ``[k*F, min((k+1)*F, raw_bytes))``;
  ``F`` is the frame size (:data:`DEFAULT_FRAME_SIZE`, 512 KiB, unless packed otherwise), so every frame
  but the last holds exactly ``F`` raw bytes and a raw offset maps to its frame by division.
- index: one zstd *skippable* frame (ignored by every zstd decoder: ``zstd -d`` of such a shard gives
  the raw Arrow file), modelled on zstd's seekable format but with a 128-bit digest per frame::

      u32 0x184D2A5E                 skippable-frame magic
      u32 payload bytes              E * n + 32
      n × (u32 stored size, u32 raw size, 16 bytes xxh128 of the stored frame
           [format 3: 16 bytes xxh128 of the frame's raw bytes, its leaf])
      u32 n, u32 F, u64 offsets_pos, u64 tokens_pos, u32 version (2 | 3), 4 bytes b"FSI2" | b"FSI3"

  ``E`` is 24 bytes (format 2) or 40 (format 3). ``offsets_pos`` / ``tokens_pos``: where the ``tokens``
  column's int32 list offsets and its first token id lie in the raw file, so a document or token range
  maps to raw bytes (then frames) by arithmetic.

The manifest pins the index (per-shard ``index_bytes`` and ``index_digest``), the index pins every frame:
a reader fetches the index once (one ranged read of the shard's tail), then any frame alone, and checks
each against its digest before decompressing it (with the bounds of :func:`ferry.shard_tools.format.shard.decompress`).
The stored digest of the manifest is that of the whole stored bytes in both formats. The raw digest is
what tells them apart: in format 2 one digest of the whole Arrow file, in format 3 the root over the
index's leaves (:func:`ferry.shard_tools.format.digest.tree_root`), which the manifest row's ``frame_size`` calls for.
So in format 3 the frame index is checked against the raw digest (its leaves, frame size and raw size
give the root), and every decoded frame against its leaf: a frame that does not hold the true raw bytes
fails on its own, whatever the stored and index digests say. The manifest row, not the index, says which
format a shard is in: an index of the other version is refused (:func:`load_index`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import xxhash
import zstandard

from ..errors import ShardDigestError, ShardFormatError
from .digest import Hasher, digest_bytes, leaf_digest, tree_root
from .manifest import ShardInfo
from .shard import (
    _HEADER_DICTIONARY_BATCH,
    _HEADER_RECORD_BATCH,
    _MESSAGE_HEADER,
    _MESSAGE_HEADER_TYPE,
    _RECORD_BATCH_COMPRESSION,
    MAX_EXPANSION,
    MAX_FRAME_SIZE,
    MIN_FRAME_SIZE,
    SHARD_SUFFIX,
    _FlatBuffer,
    decompress,
)

__all__ = [
    "DEFAULT_FRAME_SIZE",
    "MIN_FRAME_SIZE",
    "MAX_FRAME_SIZE",
    "SHARD_SUFFIX_2",
    "SHARD_SUFFIX_3",
    "INDEX_MAGIC",
    "INDEX_MAGIC_3",
    "FrameIndex",
    "encode_seekable",
    "encode_shard_frames",
    "EncodedShard",
    "parse_index",
    "find_index",
    "check_frame",
    "decode_frame",
    "decompress_seekable",
    "load_index",
    "decode_frames",
    "arrow_positions",
    "check_layout",
    "decode_head",
    "max_index_bytes",
]

DEFAULT_FRAME_SIZE = 512 << 10  # one frame's ratio at zstd 1-3, and faster packing (docs/format.md)
INDEX_MAGIC = b"FSI2"
INDEX_MAGIC_3 = b"FSI3"
SHARD_SUFFIX_2 = ".s2" + SHARD_SUFFIX  # shards/<raw digest>.s2.arrow.zst
SHARD_SUFFIX_3 = ".s3" + SHARD_SUFFIX  # shards/<tree raw digest>.s3.arrow.zst
_SKIPPABLE = 0x184D2A5E
_ENTRIES = {2: struct.Struct("<II16s"), 3: struct.Struct("<II16s16s")}  # by index version (= stored format)
_TAGS = {2: INDEX_MAGIC, 3: INDEX_MAGIC_3}
_TRAILER = struct.Struct("<IIQQI4s")
_HEAD = struct.Struct("<II")


@dataclass(frozen=True)
class FrameIndex:
    """A checked frame index: frame ``k`` is stored at ``stored_offsets[k]`` (``stored_sizes[k]`` bytes)
    and holds raw bytes ``[k * frame_size, k * frame_size + raw_sizes[k])``."""

    frame_size: int
    stored_sizes: np.ndarray
    raw_sizes: np.ndarray
    stored_offsets: np.ndarray
    digests: bytes  # 16 bytes per frame
    offsets_pos: int
    tokens_pos: int
    itemsize: int = 0  # bytes per token id, once :func:`check_layout` has checked the index against the file
    version: int = 2  # the stored format: 3 has a leaf (the digest of the raw bytes) per frame
    leaves: bytes = b""  # format 3: 16 bytes per frame

    @property
    def frames(self) -> int:
        return len(self.stored_sizes)

    def root(self, raw_bytes: int) -> str:
        """The tree-shaped raw digest this format-3 index's leaves give."""
        return tree_root(self.frame_size, raw_bytes, self.leaves)

    def span(self, k: int) -> tuple[int, int]:
        """(offset, length) of frame ``k`` in the stored shard."""
        return int(self.stored_offsets[k]), int(self.stored_sizes[k])

    def frames_of(self, start: int, end: int) -> range:
        """Frames holding raw bytes ``[start, end)`` (``end > start``)."""
        return range(start // self.frame_size, (end - 1) // self.frame_size + 1)

    def digest(self, k: int) -> bytes:
        return self.digests[16 * k : 16 * k + 16]


def arrow_positions(raw: pa.Buffer) -> tuple[int, int]:
    """(offsets_pos, tokens_pos) of a raw shard: where its ``tokens`` list offsets and first token id lie, from
    the file's IPC metadata (the reading :func:`check_layout` compares an index against)."""
    batch = pa.ipc.open_file(raw).get_batch(0)
    column = batch.column(batch.schema.get_field_index("tokens"))
    if len(column) and column.offsets[0].as_py() != 0:  # ferry writes none; readers map offsets as token ids
        raise ShardFormatError("<new>", "the tokens column's offsets do not start at 0")
    info = ShardInfo("<new>", len(column), len(column.values), 0, raw.size, "", "")
    _, offsets_pos, tokens_pos = _tokens_layout(_FlatBuffer(memoryview(raw).cast("B"), info.path), info)
    return offsets_pos, tokens_pos


@dataclass(frozen=True)
class EncodedShard:
    """A format-2 or format-3 stored shard, as its pieces in order (the frames, then the index), and what its
    manifest row records about it (the raw digest as that format computes it). The pieces are kept apart:
    joining a shard's frames into one new buffer costs CPU on the scale of compressing them (page
    faults of a fresh allocation), and a local file is written piece by piece."""

    pieces: tuple[bytes, ...]
    stored_bytes: int
    stored_digest: str
    index_bytes: int
    index_digest: str
    raw_digest: str

    @property
    def stored(self) -> bytes:
        """The whole stored bytes (joined on each call)."""
        return b"".join(self.pieces)


def encode_seekable(
    raw: pa.Buffer | memoryview | bytes, level: int, frame_size: int = DEFAULT_FRAME_SIZE, version: int = 3
) -> bytes:
    """The format-3 (or ``version`` 2) stored bytes of a raw shard: its frames, then the index
    (single-threaded: same bytes every run)."""
    return encode_shard_frames(raw, level, frame_size, version).stored


def encode_shard_frames(
    raw: pa.Buffer | memoryview | bytes, level: int, frame_size: int = DEFAULT_FRAME_SIZE, version: int = 3
) -> EncodedShard:
    """As :func:`encode_seekable`, with the digests: the stored digest and (format 3) each frame's leaf are
    taken frame by frame while the frame is fresh in the CPU cache (no cold pass over the stored or raw
    bytes after)."""
    if not MIN_FRAME_SIZE <= frame_size <= MAX_FRAME_SIZE:
        raise ShardFormatError("<new>", f"frame size {frame_size} is outside {MIN_FRAME_SIZE}..{MAX_FRAME_SIZE}")
    if version not in _ENTRIES:
        raise ShardFormatError("<new>", f"no seekable stored format {version} (2 or 3)")
    buf = raw if isinstance(raw, pa.Buffer) else pa.py_buffer(raw)
    offsets_pos, tokens_pos = arrow_positions(buf)
    view = memoryview(buf).cast("B")
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    whole = Hasher()
    parts: list[bytes] = []
    entries: list[bytes] = []
    leaves: list[bytes] = []
    for start in range(0, len(view), frame_size):
        chunk = view[start : start + frame_size]
        frame = cctx.compress(chunk)
        parts.append(frame)
        whole.update(frame)
        entry: tuple[int | bytes, ...] = (len(frame), len(chunk), xxhash.xxh3_128_digest(frame))
        if version == 3:
            leaves.append(leaf_digest(chunk))
            entry += (leaves[-1],)
        entries.append(_ENTRIES[version].pack(*entry))
    trailer = _TRAILER.pack(len(entries), frame_size, offsets_pos, tokens_pos, version, _TAGS[version])
    payload = b"".join(entries) + trailer
    index = _HEAD.pack(_SKIPPABLE, len(payload)) + payload
    whole.update(index)
    parts.append(index)
    raw_digest = tree_root(frame_size, len(view), b"".join(leaves)) if version == 3 else digest_bytes(view)
    return EncodedShard(tuple(parts), whole.nbytes, whole.hexdigest(), len(index), digest_bytes(index), raw_digest)


def max_index_bytes(raw_bytes: int, version: int = 3) -> int:
    """The longest frame index a shard of ``raw_bytes`` can have (frames of the smallest size)."""
    return _HEAD.size + _ENTRIES[version].size * -(-max(0, raw_bytes) // MIN_FRAME_SIZE) + _TRAILER.size


def find_index(stored: memoryview, shard: str) -> int:
    """Size of the index at the end of whole stored bytes (from its trailer; checked by :func:`parse_index`)."""
    if len(stored) < _HEAD.size + _TRAILER.size:
        raise ShardFormatError(shard, "too short for a frame index; the shard is truncated")
    frames = struct.unpack_from("<I", stored, len(stored) - _TRAILER.size)[0]
    version = struct.unpack_from("<I", stored, len(stored) - 8)[0]
    entry = _ENTRIES.get(version)
    if entry is None or bytes(stored[-4:]) != _TAGS[version]:
        raise ShardFormatError(shard, "no frame index of format 2 or 3 at the end of the shard (truncated or corrupt)")
    return int(_HEAD.size + entry.size * frames + _TRAILER.size)


def parse_index(
    data: bytes | bytearray | memoryview, *, shard: str, stored_bytes: int, raw_bytes: int, version: int | None = None
) -> FrameIndex:
    """Check an index (the tail of a format-2 or format-3 shard) against the shard's sizes; ShardFormatError
    if it lies. ``version``: the stored format the index must be of (None: either).

    Everything is bounded before use: the frame count by the index length, every frame inside the
    shard and before the index, raw sizes summing to ``raw_bytes`` in frames of exactly the frame size
    (the last shorter), no frame expanding beyond what zstd can, Arrow positions inside the raw file.
    """
    view = memoryview(data).cast("B")
    if len(view) < _HEAD.size + _TRAILER.size:
        raise ShardFormatError(shard, f"frame index of {len(view)} bytes is truncated")
    magic, payload = _HEAD.unpack_from(view, 0)
    count, frame_size, offsets_pos, tokens_pos, found, tag = _TRAILER.unpack_from(view, len(view) - _TRAILER.size)
    if magic != _SKIPPABLE or found not in _ENTRIES or tag != _TAGS[found]:
        raise ShardFormatError(shard, "no frame index at the end of the shard (truncated or corrupt)")
    if version is not None and found != version:
        raise ShardFormatError(
            shard, f"holds a format-{found} frame index, its manifest row says format {version}; refused"
        )
    entry = _ENTRIES[found]
    if payload != len(view) - _HEAD.size or payload != entry.size * count + _TRAILER.size:
        raise ShardFormatError(shard, f"frame index of {len(view)} bytes does not hold its {count} frames (truncated)")
    if not MIN_FRAME_SIZE <= frame_size <= MAX_FRAME_SIZE or count != -(-raw_bytes // frame_size):
        raise ShardFormatError(shard, f"frame index says {count} frames of {frame_size} bytes for {raw_bytes} raw")
    fields = [("s", "<u4"), ("r", "<u4"), ("d", "V16")] + ([("l", "V16")] if found == 3 else [])
    table = np.frombuffer(view, dtype=np.dtype(fields), count=count, offset=8)
    stored_sizes, raw_sizes = table["s"].astype(np.int64), table["r"].astype(np.int64)
    expected = np.full(count, frame_size, dtype=np.int64)
    if count:
        expected[-1] = raw_bytes - frame_size * (count - 1)
    if not np.array_equal(raw_sizes, expected):
        raise ShardFormatError(shard, f"frame index raw sizes are not frames of {frame_size} bytes")
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(stored_sizes, out=offsets[1:])
    if int(offsets[-1]) + len(view) != stored_bytes or (count and int(stored_sizes.min()) < 9):
        raise ShardFormatError(
            shard,
            f"frame index points outside the shard ({int(offsets[-1])} frame bytes + {len(view)} index "
            f"bytes, shard has {stored_bytes})",
        )
    if count and bool(np.any(raw_sizes > MAX_EXPANSION * stored_sizes)):
        raise ShardFormatError(shard, "frame index claims a frame expands beyond what zstd can (a decompression bomb)")
    if not (0 <= offsets_pos < raw_bytes and 0 <= tokens_pos <= raw_bytes):
        raise ShardFormatError(shard, "frame index points outside the raw Arrow file")
    digests = b"".join(table["d"].tolist()) if count else b""
    leaves = b"".join(table["l"].tolist()) if count and found == 3 else b""
    return FrameIndex(
        frame_size, stored_sizes, raw_sizes, offsets[:-1], digests, offsets_pos, tokens_pos, 0, found, leaves
    )


def check_frame(index: FrameIndex, k: int, data: bytes | bytearray | memoryview, shard: str) -> None:
    """Raise unless ``data`` is exactly frame ``k`` as the index pins it (size and digest)."""
    if len(data) != int(index.stored_sizes[k]):
        raise ShardFormatError(shard, f"frame {k} is {len(data)} bytes, the index says {int(index.stored_sizes[k])}")
    if xxhash.xxh3_128_digest(data) != index.digest(k):
        raise ShardDigestError(shard, f"frame {k} does not match its digest in the frame index (corrupt copy)")


def decode_frame(
    index: FrameIndex, k: int, data: bytes | bytearray | memoryview, shard: str, *, verify: bool = True
) -> bytes:
    """The raw bytes of frame ``k`` (checked against the index first when ``verify``; in format 3 the raw
    bytes against the frame's leaf as well, always)."""
    if verify:
        check_frame(index, k, data, shard)
    raw = decompress(memoryview(data), int(index.raw_sizes[k]), f"{shard} frame {k}")
    if index.version == 3 and leaf_digest(raw) != index.leaves[16 * k : 16 * k + 16]:
        raise ShardDigestError(
            shard, f"frame {k} does not decode to the raw bytes its leaf of the raw digest names (corrupt or forged)"
        )
    return raw


def decode_head(index: FrameIndex, data: bytes | bytearray | memoryview, size: int, shard: str) -> bytes:
    """The first ``size`` raw bytes of frame 0 (``data``): the frame checked against the index (size, digest),
    decoded whole (content size bounded as every frame's) and, in format 3, checked against its leaf: only
    that binds the head to the raw digest."""
    raw_size = int(index.raw_sizes[0]) if index.frames else 0
    if not 0 <= size <= raw_size:
        raise ShardFormatError(shard, f"head of {size} bytes is outside frame 0 ({raw_size} bytes)")
    return decode_frame(index, 0, data, shard)[:size]


def load_index(data: bytes | bytearray | memoryview, info: ShardInfo) -> FrameIndex:
    """The frame index of a format-2 or format-3 shard as its manifest row pins it: size, structure (of the
    row's format), then digest; in format 3 also its frame size (the row's) and its leaves (their root must
    be the row's raw digest)."""
    if len(data) != info.index_bytes:
        raise ShardFormatError(
            info.path, f"frame index read is {len(data)} bytes, manifest says {info.index_bytes} (truncated shard?)"
        )
    index = parse_index(
        data, shard=info.path, stored_bytes=info.stored_bytes, raw_bytes=info.raw_bytes, version=info.stored_format
    )
    if digest_bytes(data) != info.index_digest:
        raise ShardDigestError(info.path, "frame index does not match its digest in the manifest (corrupt copy)")
    if index.version == 3 and index.frame_size != info.frame_size:
        raise ShardFormatError(
            info.path, f"frame index says frames of {index.frame_size} bytes, the manifest {info.frame_size}"
        )
    if index.version == 3 and index.root(info.raw_bytes) != info.raw_digest:
        raise ShardDigestError(
            info.path, "the frame index's leaves do not give the manifest's raw digest (corrupt or forged index)"
        )
    return index


def decode_frames(stored: memoryview, index: FrameIndex, raw_bytes: int, shard: str) -> bytes:
    """Every frame of whole stored bytes, each checked against the index, into the raw shard.

    Memory grows with the output the frames really yield (then one join), not with ``raw_bytes`` up
    front: a shard whose index claims more than its frames hold costs what they produce before one fails.
    """
    parts: list[bytes] = []
    try:
        for k in range(index.frames):
            offset, length = index.span(k)
            parts.append(decode_frame(index, k, stored[offset : offset + length], shard))
        return b"".join(parts)
    except MemoryError as exc:
        raise ShardFormatError(shard, f"cannot allocate {raw_bytes} bytes to decode it on this machine") from exc


def decompress_seekable(stored: bytes | memoryview, raw_bytes: int, shard: str) -> bytes:
    """Decompress whole format-2 or format-3 stored bytes into the raw shard, frame by frame, each frame
    bounded (and in format 3 checked against its leaf)."""
    view = memoryview(stored).cast("B")
    size = find_index(view, shard)
    if size > len(view):
        raise ShardFormatError(shard, f"frame index of {size} bytes is longer than the shard ({len(view)})")
    index = parse_index(view[len(view) - size :], shard=shard, stored_bytes=len(view), raw_bytes=raw_bytes)
    return decode_frames(view, index, raw_bytes, shard)


# Field numbers in Arrow's Message.fbs / Schema.fbs (beside those of shard_tools.format.shard).
_MESSAGE_BODY_LENGTH = 3
_HEADER_SCHEMA = 1
_SCHEMA_FIELDS = 1
_FIELD_NAME, _FIELD_TYPE_TYPE, _FIELD_TYPE, _FIELD_CHILDREN = 0, 2, 3, 5
_TYPE_INT, _TYPE_LIST = 2, 12
_INT_BIT_WIDTH, _INT_SIGNED = 0, 1
_BATCH_LENGTH, _BATCH_NODES, _BATCH_BUFFERS = 0, 1, 2
_MAX_MESSAGES = 64  # the schema, dictionaries, the batch: a shard with more is not read by frames
_ARROW_MAGIC = b"ARROW1"


def check_layout(head: bytes | memoryview, index: FrameIndex, info: ShardInfo) -> FrameIndex:
    """The index, checked against the Arrow metadata at the head of the raw file it describes.

    ``head`` is raw bytes ``[0, index.offsets_pos)`` (read by frames, each checked against the index): the
    file magic, the schema message and the record batch's metadata. They must place the ``tokens`` column's
    offsets and values exactly where the index says, hold ``info.documents`` documents and at least
    ``info.tokens`` token ids of 2 or 4 bytes, uncompressed, all inside the file. The index returned
    records the token width. An index whose positions moved, or a head frame swapped or rewritten, is a
    :class:`ShardFormatError` naming the shard; nothing here is read outside ``head``.
    """
    fb = _FlatBuffer(memoryview(head).cast("B"), info.path)
    try:
        itemsize, offsets_pos, tokens_pos = _tokens_layout(fb, info)
    except ShardFormatError as exc:
        reason = f"frame index does not match the Arrow file it describes: {exc.reason}"
        raise ShardFormatError(info.path, reason) from None
    if (offsets_pos, tokens_pos) != (index.offsets_pos, index.tokens_pos):
        raise ShardFormatError(
            info.path,
            f"frame index places the tokens column at {(index.offsets_pos, index.tokens_pos)}, the Arrow file "
            f"at {(offsets_pos, tokens_pos)}",
        )
    return replace(index, itemsize=itemsize)


def _tokens_layout(fb: _FlatBuffer, info: ShardInfo) -> tuple[int, int, int]:
    """(bytes per token id, offsets position, tokens position) from the head of a raw shard, checked."""
    if bytes(fb.data[: len(_ARROW_MAGIC)]) != _ARROW_MAGIC:
        raise ShardFormatError(info.path, "no Arrow file magic at raw byte 0")
    start, length, kind, body = _message(fb, 8)
    if kind != _HEADER_SCHEMA or body:
        raise ShardFormatError(info.path, "the first Arrow message is not the schema")
    itemsize = _tokens_itemsize(_FlatBuffer(fb.data[start : start + length], info.path))
    for _ in range(_MAX_MESSAGES):
        start, length, kind, body = _message(fb, start + length + body)
        if kind == _HEADER_RECORD_BATCH:
            break
        if kind != _HEADER_DICTIONARY_BATCH:
            raise ShardFormatError(info.path, f"unexpected Arrow message of type {kind} before the record batch")
    else:
        raise ShardFormatError(info.path, f"no record batch in the first {_MAX_MESSAGES} Arrow messages")
    body_start = start + length
    if body_start + body > info.raw_bytes:
        raise ShardFormatError(info.path, "the record batch's body runs past the end of the file")
    meta = _FlatBuffer(fb.data[start : start + length], info.path)
    batch = meta.deref(_require(meta, meta.deref(0), _MESSAGE_HEADER))
    if meta.field(batch, _RECORD_BATCH_COMPRESSION) is not None:
        raise ShardFormatError(info.path, "Arrow IPC body compression is not allowed in a shard")
    nodes, n_nodes = meta.vector(_require(meta, batch, _BATCH_NODES))
    buffers, n_buffers = meta.vector(_require(meta, batch, _BATCH_BUFFERS))
    if n_nodes < 2 or n_buffers < 4:
        raise ShardFormatError(info.path, "the record batch has too few nodes or buffers for a list column")
    # FieldNode {length, null_count} and Buffer {offset, length}: 16 bytes each; buffers 1 and 3 of a
    # list column are its offsets and its values
    docs, doc_nulls, values, value_nulls = (meta.read("<q", nodes + 8 * i) for i in range(4))
    rows = _scalar(meta, batch, _BATCH_LENGTH)
    if rows != info.documents or docs != info.documents or values < info.tokens or doc_nulls or value_nulls:
        raise ShardFormatError(
            info.path,
            f"the Arrow file holds {docs} documents and {values} token ids, the manifest says "
            f"{info.documents} and {info.tokens}",
        )
    offsets_at, offsets_len, tokens_at, tokens_len = (meta.read("<q", buffers + i) for i in (16, 24, 48, 56))
    if offsets_len < 4 * (info.documents + 1) or tokens_len < itemsize * info.tokens or min(offsets_at, tokens_at) < 0:
        raise ShardFormatError(info.path, "the tokens column's buffers are shorter than its documents and tokens")
    if max(offsets_at + offsets_len, tokens_at + tokens_len) > body or (
        tokens_len and offsets_at < tokens_at + tokens_len and tokens_at < offsets_at + offsets_len
    ):
        raise ShardFormatError(info.path, "the tokens column's buffers overlap or run past the record batch's body")
    return itemsize, body_start + offsets_at, body_start + tokens_at


def _message(fb: _FlatBuffer, pos: int) -> tuple[int, int, int, int]:
    """The encapsulated IPC message at ``pos``: (metadata start, metadata length, header type, body length)."""
    start = pos + 8 if fb.read("<I", pos) == 0xFFFFFFFF else pos + 4
    length = fb.read("<i", start - 4)
    if length <= 0 or start + length > len(fb.data):
        raise ShardFormatError(fb.shard, "an Arrow IPC message runs past the head of the file")
    meta = _FlatBuffer(fb.data[start : start + length], fb.shard)
    root = meta.deref(0)
    kind, body = _scalar(meta, root, _MESSAGE_HEADER_TYPE, "<B"), _scalar(meta, root, _MESSAGE_BODY_LENGTH)
    if body < 0:
        raise ShardFormatError(fb.shard, "an Arrow IPC message has a negative body length")
    return start, length, kind, body


def _tokens_itemsize(fb: _FlatBuffer) -> int:
    """Bytes per token id from the schema message in ``fb``: its first field must be ``tokens``, a list of
    unsigned 16- or 32-bit integers (as :func:`ferry.shard_tools.format.shard.encode_shard_buffer` writes it)."""
    schema = fb.deref(_require(fb, fb.deref(0), _MESSAGE_HEADER))
    fields, count = fb.vector(_require(fb, schema, _SCHEMA_FIELDS))
    field = fb.deref(fields) if count else -1
    if field < 0 or _string(fb, _require(fb, field, _FIELD_NAME)) != b"tokens":
        raise ShardFormatError(fb.shard, "the first Arrow column is not 'tokens'")
    if _scalar(fb, field, _FIELD_TYPE_TYPE, "<B") != _TYPE_LIST:
        raise ShardFormatError(fb.shard, "'tokens' is not a list column")
    children, n = fb.vector(_require(fb, field, _FIELD_CHILDREN))
    child = fb.deref(children) if n == 1 else -1
    if child < 0 or _scalar(fb, child, _FIELD_TYPE_TYPE, "<B") != _TYPE_INT:
        raise ShardFormatError(fb.shard, "'tokens' is not a list of integers")
    int_type = fb.deref(_require(fb, child, _FIELD_TYPE))
    width, signed = _scalar(fb, int_type, _INT_BIT_WIDTH, "<i"), _scalar(fb, int_type, _INT_SIGNED, "<B")
    if width not in (16, 32) or signed:
        raise ShardFormatError(fb.shard, "'tokens' is not a list of uint16 or uint32 token ids")
    return width // 8


def _require(fb: _FlatBuffer, table: int, index: int) -> int:
    pos = fb.field(table, index)
    if pos is None:
        raise ShardFormatError(fb.shard, f"Arrow IPC metadata lacks field {index} of a table")
    return pos


def _scalar(fb: _FlatBuffer, table: int, index: int, fmt: str = "<q") -> int:
    """A scalar field (flatbuffers leave out a field that holds its default, 0)."""
    pos = fb.field(table, index)
    return 0 if pos is None else fb.read(fmt, pos)


def _string(fb: _FlatBuffer, pos: int) -> bytes:
    start, size = fb.vector(pos)
    if start + size > len(fb.data):
        raise ShardFormatError(fb.shard, "an Arrow IPC string runs past its metadata")
    return bytes(fb.data[start : start + size])
