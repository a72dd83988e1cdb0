"""A shard's media metadata is read from its column without copying the media bytes."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from ferry.shard_tools.format.arrays import one_array
from ferry.shard_tools.format.media import MediaItem, MediaMeta, media_array

_ITEM_BYTES = 1 << 20


def _column(chunks: int) -> pa.ChunkedArray:
    def doc(k: int) -> list[MediaItem]:
        data = bytes([k]) * _ITEM_BYTES
        return [MediaItem("image", "png", 8, 8, 0.0, 1, data, position=1, cost=4)]

    return pa.chunked_array([media_array([doc(4 * c + k) for k in range(4)]) for c in range(chunks)])


def test_the_metadata_of_a_one_chunk_column_copies_no_media_bytes(capfd: pytest.CaptureFixture[str]) -> None:
    column = _column(1)
    capfd.readouterr()
    pa.log_memory_allocations(True)  # each allocation of Arrow's pool, printed on stdout
    try:
        meta = MediaMeta.from_column(column, "s")
    finally:
        pa.log_memory_allocations(False)
    sizes = [int(n) for n in re.findall(r"Allocate: size = (\d+)", capfd.readouterr().out)]
    assert not [n for n in sizes if n >= _ITEM_BYTES], sizes  # combine_chunks would copy all 4 MiB
    assert meta.data_offsets.tolist() == [k * _ITEM_BYTES for k in range(5)]
    assert meta.doc_offsets.tolist() == [0, 1, 2, 3, 4]


def test_a_column_of_several_chunks_is_read_whole() -> None:
    column = _column(2)
    meta = MediaMeta.from_column(column, "s")
    assert meta.data_offsets.tolist() == [k * _ITEM_BYTES for k in range(9)]
    assert one_array(column).equals(column.combine_chunks())
    assert one_array(column.chunk(0)) is column.chunk(0) or one_array(column.chunk(0)).equals(column.chunk(0))
