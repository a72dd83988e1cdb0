"""The shard format: encode/parse both ways, eager validation, zero-copy memory mapping."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ferry.shard_tools import ShardFormatError, TokenRangeError
from ferry.shard_tools.format.shard import (
    compress,
    decompress,
    dtype_for_vocab,
    encode_shard,
    encode_shard_buffer,
    open_shard_file,
    parse_shard,
)

TOKENS = np.array([5, 6, 7, 8, 9, 10], dtype=np.uint16)
OFFSETS = np.array([0, 2, 2, 6], dtype=np.int64)  # 3 documents, the middle one empty


def test_dtype_for_vocab_boundaries() -> None:
    assert dtype_for_vocab(1) == "uint16" and dtype_for_vocab(65_536) == "uint16"
    assert dtype_for_vocab(65_537) == "uint32" and dtype_for_vocab(2**32) == "uint32"
    for bad in (0, -3, 2**32 + 1):
        with pytest.raises(TokenRangeError):
            dtype_for_vocab(bad)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_encode_parse_roundtrip(dtype: str) -> None:
    raw = encode_shard(TOKENS, OFFSETS, dtype)
    assert raw == bytes(memoryview(encode_shard_buffer(TOKENS, OFFSETS, dtype)))  # deterministic bytes
    view = parse_shard(raw, shard="s", dtype=dtype, documents=3, tokens=6)
    assert view.tokens.dtype == np.dtype(dtype) and view.num_documents == 3 and view.num_tokens == 6
    assert [view.document(i).tolist() for i in range(3)] == [[5, 6], [], [7, 8, 9, 10]]


def test_extra_columns_are_kept() -> None:
    raw = encode_shard(TOKENS, OFFSETS, "uint16", extra={"source": pa.array(["a", "b", "c"])})
    view = parse_shard(raw, shard="s")
    assert view.table.column("source").to_pylist() == ["a", "b", "c"]
    with pytest.raises(ShardFormatError, match="wrong length"):
        encode_shard(TOKENS, OFFSETS, "uint16", extra={"source": pa.array(["a"])})


def test_compress_is_one_frame_with_size() -> None:
    raw = encode_shard(TOKENS, OFFSETS, "uint16")
    stored = compress(raw, 1)
    assert stored == compress(raw, 1)
    assert decompress(stored, len(raw), "s") == raw
    with pytest.raises(ShardFormatError, match="manifest says"):
        decompress(stored, len(raw) + 1, "s")
    with pytest.raises(ShardFormatError, match="truncated or corrupt"):
        decompress(stored[:-5], len(raw), "s")
    with pytest.raises(ShardFormatError, match="shard s"):
        decompress(b"not zstd at all", len(raw), "s")


def test_encode_rejects_unknown_dtype() -> None:
    with pytest.raises(ShardFormatError, match="unknown token dtype"):
        encode_shard(TOKENS, OFFSETS, "int8")


def _file(batches: list[pa.RecordBatch], metadata: dict[bytes, bytes] | None = None) -> bytes:
    schema = batches[0].schema.with_metadata(metadata if metadata is not None else {b"ferry.format": b"1"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as w:
        for b in batches:
            w.write_batch(b.replace_schema_metadata(schema.metadata))
    return sink.getvalue().to_pybytes()


def _batch(values: list[list[int] | None], typ: pa.DataType | None = None, name: str = "tokens") -> pa.RecordBatch:
    return pa.record_batch([pa.array(values, type=pa.list_(typ or pa.uint16()))], names=[name])


@pytest.mark.parametrize(
    "raw, kwargs, needle",
    [
        (b"garbage", {}, "not a readable Arrow IPC file"),
        (_file([_batch([[1]])], metadata={}), {}, "ferry.format"),
        (_file([_batch([[1]]), _batch([[2]])]), {}, "expected 1 record batch"),
        (_file([_batch([[1]], name="ids")]), {}, "no 'tokens' column"),
        (_file([_batch([[1]], typ=pa.int8())]), {}, "unknown token dtype int8"),
        (_file([_batch([[1], None])]), {}, "null documents"),
        (_file([_batch([[1, None]])]), {}, "null token ids"),
        (_file([_batch([[1]])]), {"dtype": "uint32"}, "manifest says uint32"),
        (_file([_batch([[1], [2]])]), {"documents": 3}, "2 documents, manifest says 3"),
        (_file([_batch([[1], [2]])]), {"tokens": 1}, "2 tokens, manifest says 1"),
    ],
)
def test_parse_validates_eagerly(raw: bytes, kwargs: dict, needle: str) -> None:
    with pytest.raises(ShardFormatError, match=needle) as exc:
        parse_shard(raw, shard="shards/x.arrow.zst", **kwargs)
    assert exc.value.shard == "shards/x.arrow.zst"


def test_open_shard_file_is_zero_copy(tmp_path: Path) -> None:
    tokens = np.arange(2_000_000, dtype=np.uint32)
    offsets = np.array([0, 1_000_000, 2_000_000])
    path = tmp_path / "s.arrow"
    path.write_bytes(encode_shard(tokens, offsets, "uint32"))
    before = pa.total_allocated_bytes()
    view = open_shard_file(str(path), shard="s", dtype="uint32", documents=2, tokens=2_000_000)
    assert pa.total_allocated_bytes() - before < 1_000_000  # nothing of the 8 MB was copied into Arrow memory
    assert not view.tokens.flags.owndata and not view.tokens.flags.writeable
    assert np.array_equal(view.document(1), tokens[1_000_000:])
    with pytest.raises(ShardFormatError, match="cannot map"):
        open_shard_file(str(tmp_path / "missing.arrow"), shard="s")
