"""The shard format, both directions: Arrow IPC file, one ``tokens`` list column, one zstd frame.

A raw shard is an Arrow IPC *file* holding one record batch whose column ``tokens``
is ``list<uint16>`` (vocabulary ≤ 65536) or ``list<uint32>``; one list per document.
Further columns (``loss_mask``, ``source``…) are allowed and kept. The schema carries
``ferry.format = 1`` in its metadata. The stored form is the raw file compressed as one
zstd frame with the content size in its header (``*.arrow.zst``).

Readers validate eagerly: schema, dtype, document and token counts, and (by the caller)
digests. A decompressed shard in a local file is memory-mapped and read zero-copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import zstandard

from .errors import ShardFormatError, TokenRangeError
from .header import TOKEN_DTYPE_NAMES

__all__ = [
    "FORMAT_VERSION",
    "SHARD_SUFFIX",
    "TOKEN_DTYPES",
    "ShardView",
    "dtype_for_vocab",
    "encode_shard",
    "encode_shard_buffer",
    "compress",
    "decompress",
    "parse_shard",
    "open_shard_file",
]

FORMAT_VERSION = 1
SHARD_SUFFIX = ".arrow.zst"
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


def decompress(stored: bytes | memoryview, raw_bytes: int, shard: str) -> bytes:
    """Decompress a stored shard, checking it is one frame of exactly ``raw_bytes`` bytes."""
    try:
        params = zstandard.get_frame_parameters(stored)
        if params.content_size != raw_bytes:
            raise ShardFormatError(shard, f"frame says {params.content_size} raw bytes, manifest says {raw_bytes}")
        raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_bytes)
    except zstandard.ZstdError as exc:
        raise ShardFormatError(shard, f"not a valid zstd frame ({exc}); the shard is truncated or corrupt") from exc
    if len(raw) != raw_bytes:
        raise ShardFormatError(shard, f"decompressed to {len(raw)} bytes, manifest says {raw_bytes}")
    return raw


def parse_shard(
    source: pa.Buffer | pa.NativeFile | bytes,
    *,
    shard: str,
    dtype: str | None = None,
    documents: int | None = None,
    tokens: int | None = None,
) -> ShardView:
    """Open raw shard bytes (or a memory-mapped file) zero-copy and validate its structure."""
    try:
        src = pa.py_buffer(source) if isinstance(source, bytes) else source
        reader = pa.ipc.open_file(src)
        if reader.num_record_batches != 1:
            raise ShardFormatError(shard, f"expected 1 record batch, found {reader.num_record_batches}")
        batch = reader.get_batch(0)
    except pa.ArrowException as exc:
        raise ShardFormatError(shard, f"not a readable Arrow IPC file ({exc})") from exc
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
    offsets = column.offsets.to_numpy()
    values = column.values
    if values.null_count:
        raise ShardFormatError(shard, "'tokens' has null token ids")
    flat = values.to_numpy(zero_copy_only=True)[offsets[0] : offsets[-1]]
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
