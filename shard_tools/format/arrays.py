"""Arrow columns as single arrays."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["MALLOC_POOL", "one_array"]

# The pool of what a dataset's shard table allocates as it is read and checked: malloc's. The first allocation from
# Arrow's default pool (mimalloc) sets up its arena, and zeroing the arena's huge page was, on cold starts measured
# in bench/, sometimes a larger part of a first batch than the batch itself.
MALLOC_POOL = pa.system_memory_pool()


def one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column`` as one array: the only chunk of a one-chunk column itself, since ``combine_chunks`` copies even
    that one (a shard's whole media column: every byte of its media); several chunks are combined."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column
