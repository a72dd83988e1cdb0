"""Arrow columns as single arrays, and the memory pool a shard table is read and checked with."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["SMALL_TABLE_BYTES", "one_array", "pool_for"]

# A shard table this small allocates from malloc as it is read and checked, a larger one from Arrow's default pool.
# The first allocation from the default pool (mimalloc) sets up its arena, and zeroing the arena's huge page was,
# on cold starts measured in bench/, sometimes a larger part of a first batch than the batch itself; a million-row
# table reads and checks faster from the default pool (measured), which repays that set-up.
SMALL_TABLE_BYTES = 1 << 20


def pool_for(nbytes: int) -> pa.MemoryPool:
    """The pool for reading and checking a shard table of ``nbytes`` bytes (see :data:`SMALL_TABLE_BYTES`)."""
    return pa.system_memory_pool() if nbytes < SMALL_TABLE_BYTES else pa.default_memory_pool()


def one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column`` as one array: the only chunk of a one-chunk column itself, since ``combine_chunks`` copies even
    that one (a shard's whole media column: every byte of its media); several chunks are combined."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column
