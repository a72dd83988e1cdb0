"""The shard format, both directions: Arrow IPC file, one ``tokens`` list column, one zstd frame.

A raw shard is an Arrow IPC *file* holding one record batch whose column ``tokens``
is ``list<uint16>`` (vocabulary ≤ 65536) or ``list<uint32>``; one list per document.
Further columns (``loss_mask``, ``source``…) are allowed and kept. The schema carries
``ferry.format = 1`` in its metadata (the version of this Arrow content, the same in every stored
format). The stored form (``*.arrow.zst``) is, in stored format 1, the raw file compressed as one
zstd frame with the content size in its header; in stored formats 2 and 3, a sequence of independently
compressed frames and a frame index (:mod:`ferry.shard_tools.format.seekable`). :func:`decompress` reads all three.

Readers validate eagerly: schema, dtype, document and token counts, and (by the caller)
digests. A decompressed shard in a local file is memory-mapped and read zero-copy.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import zstandard

from ..errors import ShardFormatError, TokenRangeError
from .header import TOKEN_DTYPE_NAMES

__all__ = [
    "FORMAT_VERSION",
    "STORED_FORMATS",
    "SHARD_SUFFIX",
    "MIN_FRAME_SIZE",
    "MAX_FRAME_SIZE",
    "TOKEN_DTYPES",
    "ShardView",
    "dtype_for_vocab",
    "encode_shard",
    "encode_shard_buffer",
    "compress",
    "decompress",
    "MAX_EXPANSION",
    "parse_shard",
    "open_shard_file",
]

FORMAT_VERSION = 1
#: Stored formats: 1 = one zstd frame, 2 = seekable frames + frame index, 3 = the same with a tree-shaped raw
#: digest and a raw digest per frame in the index (shard_tools.format.seekable).
STORED_FORMATS = (1, 2, 3)
SHARD_SUFFIX = ".arrow.zst"
#: Raw bytes per frame of the seekable formats (2, 3); in format 3 the manifest row records it.
MIN_FRAME_SIZE = 4 << 10
MAX_FRAME_SIZE = 64 << 20
_META_KEY = b"ferry.format"
TOKEN_DTYPES: dict[str, pa.DataType] = {name: pa.from_numpy_dtype(np.dtype(name)) for name in TOKEN_DTYPE_NAMES}
_MAX_TOKENS_PER_SHARD = 2**31 - 1  # list<> uses int32 offsets


def dtype_for_vocab(vocab_size: int) -> str:
    """The narrowest token dtype that holds every id below ``vocab_size``."""
    if vocab_size <= 0:
        raise TokenRangeError(f"vocabulary size must be positive, got {vocab_size}")
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise TokenRangeError(f"vocabulary size {vocab_size} does not fit uint32 token ids")


@dataclass(frozen=True)
class ShardView:
    """A decoded shard. ``tokens`` is the flat token stream (zero-copy over the Arrow buffer),
    ``offsets`` has one entry more than there are documents: document ``i`` is
    ``tokens[offsets[i]:offsets[i + 1]]``."""

    table: pa.Table
    tokens: np.ndarray
    offsets: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def encode_shard(
    tokens: np.ndarray,
    offsets: np.ndarray,
    dtype: str,
    extra: Mapping[str, pa.Array] | None = None,
) -> bytes:
    """Serialise documents (flat ``tokens`` + ``offsets``) to the raw Arrow IPC bytes of a shard."""
    return encode_shard_buffer(tokens, offsets, dtype, extra).to_pybytes()


def encode_shard_buffer(
    tokens: np.ndarray,
    offsets: np.ndarray,
    dtype: str,
    extra: Mapping[str, pa.Array] | None = None,
) -> pa.Buffer:
    """As :func:`encode_shard`, without copying the result out of Arrow's buffer (the packer's path)."""
    if dtype not in TOKEN_DTYPES:
        raise ShardFormatError("<new>", f"unknown token dtype {dtype!r}")
    if int(offsets[-1]) > _MAX_TOKENS_PER_SHARD:
        raise ShardFormatError("<new>", "more than 2**31-1 tokens in one shard; lower --shard-size")
    values = pa.array(np.ascontiguousarray(tokens, dtype=np.dtype(dtype)), type=TOKEN_DTYPES[dtype])
    lists = pa.ListArray.from_arrays(pa.array(np.asarray(offsets, dtype=np.int32)), values)
    columns: dict[str, pa.Array] = {"tokens": lists}
    for name, arr in (extra or {}).items():
        if name == "tokens" or len(arr) != len(lists):
            raise ShardFormatError("<new>", f"extra column {name!r} clashes or has the wrong length")
        columns[name] = arr
    batch = pa.RecordBatch.from_pydict(columns)
    schema = batch.schema.with_metadata({_META_KEY: str(FORMAT_VERSION).encode()})
    batch = batch.replace_schema_metadata(schema.metadata)
    # Size the file first (no copies), then write it into one buffer allocated once: a growing
    # BufferOutputStream would reallocate and copy a 128 MiB shard several times.
    mock = pa.MockOutputStream()
    with pa.ipc.new_file(mock, schema) as writer:
        writer.write_batch(batch)
    buffer = pa.allocate_buffer(mock.size())
    with pa.ipc.new_file(pa.FixedSizeBufferWriter(buffer), schema) as writer:
        writer.write_batch(batch)
    return buffer


def compress(raw: bytes | memoryview | pa.Buffer, level: int) -> bytes:
    """One zstd frame with the content size recorded (single-threaded: same bytes every run)."""
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(raw)


# Decoding trusts nothing it has not bounded (DESIGN §1). A zstd block yields at most BLOCKSIZE_MAX (128 KiB)
# and costs at least 4 stored bytes (a 3-byte header and one byte of RLE), so no frame expands more than
# 32768:1: a raw size above that is impossible, refused before anything is decoded.
MAX_EXPANSION = zstandard.BLOCKSIZE_MAX // 4
# Up to this ratio (or this size) the output is allocated at once at its declared size: at most 64 times
# the stored bytes already in memory. Beyond it the frame is decoded in steps (see decompress).
_PREALLOC_EXPANSION = 64
_PREALLOC_BYTES = 8 << 20
_STREAM_STEP = 1024  # stored bytes per step: at most 32 MiB of output each
_SEEKABLE_TAGS = (b"FSI2", b"FSI3")  # the last bytes of a format-2 or -3 stored shard (shard_tools.format.seekable)
_TRAILING = "bytes after the end of its zstd frame (a shard is one frame); the shard is corrupt or was tampered with"


def decompress(stored: bytes | memoryview, raw_bytes: int, shard: str) -> bytes:
    """Decompress a stored shard, checking it is one zstd frame of exactly ``raw_bytes`` bytes (format 1),
    or, when it ends with a frame index (formats 2 and 3), frames checked against that index, each as below.

    Nothing is allocated on the word of the manifest or the frame header alone:

    - the frame header must record a content size, and it must equal ``raw_bytes``;
    - ``raw_bytes`` may be at most :data:`MAX_EXPANSION` (32768) times the stored size, more than any
      zstd frame can expand: a 17-byte frame claiming 1 TiB is refused at once. No lower ratio is
      refused, because real shards reach it: an all-zero shard compresses to about 32600:1, and ferry
      packs whatever tokens it is given;
    - within that bound, a claim above 64:1 (and above 8 MiB) is not allocated up front: the frame is
      decoded in small steps and memory grows only with the output it really yields (peak about twice
      that output), so a lying size costs what the frame produces, not what it claims. Ordinary shards
      (a few to one) take the fast path, one allocation of the declared size.

    More output than declared, a frame that ends early, bytes or a second frame after the first, and
    an allocation this machine cannot make are all :class:`ShardFormatError` naming the shard.
    """
    view = memoryview(stored).cast("B")
    if raw_bytes < 0 or raw_bytes > MAX_EXPANSION * len(view):
        raise ShardFormatError(
            shard,
            f"manifest says {raw_bytes} raw bytes from {len(view)} stored bytes, more than any zstd frame "
            f"expands (at most {MAX_EXPANSION}:1): a decompression bomb or a corrupt manifest",
        )
    if bytes(view[-4:]) in _SEEKABLE_TAGS:  # formats 2 and 3: every frame checked and bounded the same way
        from .seekable import decompress_seekable

        return decompress_seekable(view, raw_bytes, shard)
    _check_frame_header(view, raw_bytes, shard)
    try:
        if raw_bytes and raw_bytes <= max(_PREALLOC_EXPANSION * len(view), _PREALLOC_BYTES):
            raw = zstandard.ZstdDecompressor().decompress(view, allow_extra_data=False)
        else:
            raw = _decompress_stepwise(view, raw_bytes, shard)
    except zstandard.ZstdError as exc:
        if "unused data" in str(exc):  # allow_extra_data=False found bytes after the frame
            raise ShardFormatError(shard, f"{_TRAILING} ({exc})") from exc
        raise ShardFormatError(shard, f"not a valid zstd frame ({exc}); the shard is truncated or corrupt") from exc
    except MemoryError as exc:
        raise ShardFormatError(shard, f"cannot allocate {raw_bytes} bytes to decode it on this machine") from exc
    if len(raw) != raw_bytes:
        raise ShardFormatError(shard, f"decompressed to {len(raw)} bytes, manifest says {raw_bytes}")
    return raw


def _check_frame_header(view: memoryview, raw_bytes: int, shard: str) -> None:
    """One zstd frame (not a skippable one) whose header records exactly ``raw_bytes`` of content."""
    if bytes(view[:4]) != zstandard.FRAME_HEADER:
        raise ShardFormatError(shard, "does not start with a zstd frame; the shard is corrupt or not a ferry shard")
    try:
        size = zstandard.get_frame_parameters(view).content_size
    except zstandard.ZstdError as exc:
        raise ShardFormatError(
            shard, f"unreadable zstd frame header ({exc}); the shard is truncated or corrupt"
        ) from exc
    if size == zstandard.CONTENTSIZE_UNKNOWN:
        raise ShardFormatError(shard, "zstd frame header records no content size (ferry always writes one)")
    if size != raw_bytes:
        raise ShardFormatError(shard, f"frame says {size} raw bytes, manifest says {raw_bytes}")


def _decompress_stepwise(view: memoryview, raw_bytes: int, shard: str) -> bytes:
    """Decode in small input steps, stopping as soon as the output passes ``raw_bytes``."""
    dobj = zstandard.ZstdDecompressor().decompressobj()
    chunks: list[bytes] = []
    total = 0
    for start in range(0, len(view), _STREAM_STEP):
        chunk = dobj.decompress(view[start : start + _STREAM_STEP])
        total += len(chunk)
        if total > raw_bytes:
            raise ShardFormatError(shard, f"frame yields more than the {raw_bytes} raw bytes it declares")
        chunks.append(chunk)
        if dobj.eof:
            if dobj.unused_data or start + _STREAM_STEP < len(view):
                raise ShardFormatError(shard, _TRAILING)
            return b"".join(chunks)
    raise ShardFormatError(shard, "zstd frame ends early; the shard is truncated")


class _FlatBuffer:
    """Bounds-checked reads of a flatbuffer (just what finding a record batch's compression field needs)."""

    def __init__(self, data: memoryview, shard: str) -> None:
        self.data, self.shard = data, shard

    def read(self, fmt: str, pos: int) -> int:
        if not 0 <= pos <= len(self.data) - struct.calcsize(fmt):
            raise ShardFormatError(self.shard, "Arrow IPC metadata points outside the file; the shard is corrupt")
        value: int = struct.unpack_from(fmt, self.data, pos)[0]
        return value

    def deref(self, pos: int) -> int:
        """The table or vector a uoffset at ``pos`` points to."""
        return pos + self.read("<I", pos)

    def field(self, table: int, index: int) -> int | None:
        """Where field ``index`` of the table at ``table`` is stored, None when absent."""
        vtable = table - self.read("<i", table)
        slot = 4 + 2 * index
        if slot >= self.read("<H", vtable):
            return None
        offset = self.read("<H", vtable + slot)
        return table + offset if offset else None

    def vector(self, pos: int) -> tuple[int, int]:
        start = self.deref(pos)
        return start + 4, self.read("<I", start)


# Field numbers in Arrow's File.fbs / Message.fbs / Schema.fbs.
_FOOTER_DICTIONARIES, _FOOTER_RECORD_BATCHES = 2, 3
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2
_HEADER_DICTIONARY_BATCH, _HEADER_RECORD_BATCH = 2, 3
_DICTIONARY_DATA, _RECORD_BATCH_COMPRESSION = 1, 3
_BLOCK_SIZE = 24  # struct Block {offset: long; metaDataLength: int; bodyLength: long}


def _check_uncompressed_body(buf: pa.Buffer, shard: str) -> None:
    """Refuse an Arrow file whose batches use IPC body compression, before Arrow decompresses them.

    A shard is stored compressed once (zstd) and read zero-copy raw; compressed IPC buffers would
    be a second, unbounded expansion (each declares its own uncompressed length), so the footer's
    blocks are followed to every message and its ``compression`` field must be absent.
    """
    data = memoryview(buf).cast("B")
    footer_len = _FlatBuffer(data, shard).read("<i", len(data) - 10)
    footer = _FlatBuffer(data[max(0, len(data) - 10 - footer_len) : len(data) - 10], shard)
    root = footer.deref(0)
    for index in (_FOOTER_DICTIONARIES, _FOOTER_RECORD_BATCHES):
        pos = footer.field(root, index)
        if pos is None:
            continue
        start, count = footer.vector(pos)
        for i in range(count):
            offset = footer.read("<q", start + i * _BLOCK_SIZE)
            if _message_compressed(data, offset, shard):
                raise ShardFormatError(shard, "Arrow IPC body compression is not allowed in a shard (format 1)")


def _message_compressed(data: memoryview, offset: int, shard: str) -> bool:
    """Whether the IPC message at ``offset`` (a record or dictionary batch) declares body compression."""
    whole = _FlatBuffer(data, shard)
    start = offset + 8 if whole.read("<I", offset) == 0xFFFFFFFF else offset + 4
    length = whole.read("<i", start - 4)
    if length < 0 or start + length > len(data):
        raise ShardFormatError(shard, "Arrow IPC message runs past the end of the file; the shard is corrupt")
    fb = _FlatBuffer(data[start : start + length], shard)
    message = fb.deref(0)
    kind_pos, header_pos = fb.field(message, _MESSAGE_HEADER_TYPE), fb.field(message, _MESSAGE_HEADER)
    if kind_pos is None or header_pos is None:
        return False  # not a batch: Arrow rejects it
    kind, batch = fb.read("<B", kind_pos), fb.deref(header_pos)
    if kind == _HEADER_DICTIONARY_BATCH:
        data_pos = fb.field(batch, _DICTIONARY_DATA)
        if data_pos is None:
            return False
        batch = fb.deref(data_pos)
    elif kind != _HEADER_RECORD_BATCH:
        return False
    return fb.field(batch, _RECORD_BATCH_COMPRESSION) is not None


def _read_one_batch(
    source: pa.Buffer | pa.NativeFile | bytes, shard: str
) -> tuple[pa.ipc.RecordBatchFileReader, pa.RecordBatch]:
    """The one record batch of an Arrow IPC file, fully validated before any of its values is read.

    The footer, message lengths and buffer sizes of a hostile file can lie; Arrow checks them
    against the file when reading, and full validation then checks every offset against the
    buffers it points into (without it, a list whose length outruns its values buffer is read
    out of bounds). Full validation is cheap here: it touches offsets and bitmaps, not tokens.
    """
    try:
        if isinstance(source, pa.NativeFile):  # a memory map: the whole file as one zero-copy buffer
            source.seek(0)
            buf = source.read_buffer()
        else:
            buf = pa.py_buffer(source) if isinstance(source, bytes) else source
        reader = pa.ipc.open_file(buf)
        if reader.num_record_batches != 1:
            raise ShardFormatError(shard, f"expected 1 record batch, found {reader.num_record_batches}")
        _check_uncompressed_body(buf, shard)
        batch = reader.get_batch(0)
        batch.validate(full=True)
    except (pa.ArrowException, OSError) as exc:  # a flatbuffer that fails verification is an OSError
        raise ShardFormatError(shard, f"not a readable Arrow IPC file ({exc})") from exc
    return reader, batch


def _numpy(arr: pa.Array) -> np.ndarray:
    """A null-free integer array as numpy over its Arrow data buffer, zero-copy (``Array.to_numpy`` imports
    pandas on first use, a large part of a cold start)."""
    dtype = np.dtype(arr.type.to_pandas_dtype()).newbyteorder("<")
    if len(arr) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def parse_shard(
    source: pa.Buffer | pa.NativeFile | bytes,
    *,
    shard: str,
    dtype: str | None = None,
    documents: int | None = None,
    tokens: int | None = None,
) -> ShardView:
    """Open raw shard bytes (or a memory-mapped file) zero-copy and validate its structure."""
    reader, batch = _read_one_batch(source, shard)
    meta = reader.schema.metadata or {}
    if meta.get(_META_KEY) != str(FORMAT_VERSION).encode():
        raise ShardFormatError(shard, f"missing or unsupported ferry.format metadata {meta.get(_META_KEY)!r}")
    field_index = reader.schema.get_field_index("tokens")
    if field_index < 0:
        raise ShardFormatError(shard, "no 'tokens' column")
    column = batch.column(field_index)
    if not pa.types.is_list(column.type):
        raise ShardFormatError(shard, f"'tokens' is {column.type}, expected a list of token ids")
    value_type = column.type.value_type
    found = next((name for name, t in TOKEN_DTYPES.items() if t == value_type), None)
    if found is None:
        raise ShardFormatError(shard, f"unknown token dtype {value_type}")
    if dtype is not None and found != dtype:
        raise ShardFormatError(shard, f"token dtype is {found}, manifest says {dtype}")
    if column.null_count:
        raise ShardFormatError(shard, "'tokens' has null documents")
    offsets = _numpy(column.offsets)
    values = column.values
    if values.null_count:
        raise ShardFormatError(shard, "'tokens' has null token ids")
    flat = _numpy(values)[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0] if offsets[0] else offsets
    if documents is not None and len(column) != documents:
        raise ShardFormatError(shard, f"{len(column)} documents, manifest says {documents}")
    if tokens is not None and flat.shape[0] != tokens:
        raise ShardFormatError(shard, f"{flat.shape[0]} tokens, manifest says {tokens}")
    return ShardView(pa.Table.from_batches([batch]), flat, offsets)


def open_shard_file(
    path: str,
    *,
    shard: str,
    dtype: str | None = None,
    documents: int | None = None,
    tokens: int | None = None,
) -> ShardView:
    """Memory-map a decompressed shard file and read it zero-copy."""
    try:
        mm = pa.memory_map(path, "r")
    except (OSError, pa.ArrowException) as exc:
        raise ShardFormatError(shard, f"cannot map {path}: {exc}") from exc
    return parse_shard(mm, shard=shard, dtype=dtype, documents=documents, tokens=tokens)
