"""Arrow columns made straight from their buffers, and numpy arrays read straight from theirs.

``pyarrow.array``, ``pyarrow.scalar`` and ``Array.to_numpy`` of booleans or of a column with nulls look
for pandas on their first call and import it where installed: over a second and tens of MiB in a
daemon that otherwise never needs it. The replication planner and state convert their columns here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["strings", "int64s", "bools", "positions", "common_prefix", "release_memory", "EMPTY_STRINGS"]

_MAX_OFFSET = 2**31 - 1  # a string column's 32-bit offsets


def strings(values: Iterable[str]) -> pa.StringArray:
    """An Arrow string column of ``values``, in order."""
    encoded = [v.encode() for v in values]
    ends = np.cumsum(np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded)))
    if len(ends) and int(ends[-1]) > _MAX_OFFSET:
        raise ValueError(f"{int(ends[-1])} bytes of strings do not fit one Arrow string column")
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    offsets[1:] = ends
    column = pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))
    assert isinstance(column, pa.StringArray)
    return column


def int64s(values: np.ndarray) -> pa.Int64Array:
    """An Arrow int64 column of a numpy array's values (row numbers to ``take``)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    column = pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])
    assert isinstance(column, pa.Int64Array)
    return column


def _valid(column: pa.Array) -> np.ndarray:
    """A bool per row: not null."""
    bitmap = column.buffers()[0]
    if bitmap is None or column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    return _bits(bitmap, column.offset, len(column))


def _bits(buffer: pa.Buffer, offset: int, n: int) -> np.ndarray:
    packed = np.frombuffer(buffer, dtype=np.uint8)
    return np.unpackbits(packed, bitorder="little")[offset : offset + n].astype(bool)


def bools(column: pa.BooleanArray) -> np.ndarray:
    """A boolean column as a numpy bool array (null: False)."""
    values = column.buffers()[1]
    if values is None or len(column) == 0:
        return np.zeros(len(column), dtype=bool)
    return _bits(values, column.offset, len(column)) & _valid(column)


def positions(column: pa.Array) -> np.ndarray:
    """An integer column (``index_in``'s) as numpy int64, -1 where null."""
    dtype = np.dtype(f"int{column.type.bit_width}")
    values = column.buffers()[1]
    if values is None or len(column) == 0:
        return np.full(len(column), -1, dtype=np.int64)
    out = np.frombuffer(values, dtype=dtype)[column.offset : column.offset + len(column)].astype(np.int64)
    out[~_valid(column)] = -1
    return out


def common_prefix(a: pa.StringArray, b: pa.StringArray) -> int:
    """How many leading rows ``a`` and ``b`` have equal (one vectorised comparison, no hashing)."""
    k = min(len(a), len(b))
    if k == 0:
        return 0
    same = bools(pc.equal(a.slice(0, k), b.slice(0, k)))
    return k if bool(same.all()) else int(np.argmin(same))


def release_memory() -> None:
    """Hand memory freed since back to the system: Arrow's pool (a load's transient copies, planning's hash
    tables) and, with glibc, the C heap's free pages (``malloc_trim``; elsewhere nothing more)."""
    pa.default_memory_pool().release_unused()
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL(None).malloc_trim
        except (AttributeError, OSError):
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None  # libc's malloc_trim once looked up; False where there is none

EMPTY_STRINGS = strings(())
