"""Arrow columns as single arrays."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["one_array"]


def one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column`` as one array: the only chunk of a one-chunk column itself, since ``combine_chunks`` copies even
    that one (a shard's whole media column: every byte of its media); several chunks are combined."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column
