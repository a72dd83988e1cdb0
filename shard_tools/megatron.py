"""Megatron-LM indexed datasets (``MMIDIDX``): read and write the ``.idx`` + ``.bin`` pair.

``.idx`` layout (little-endian): magic ``b"MMIDIDX\\x00\\x00"``, version ``<Q`` = 1, dtype code
``<B``, sequence count ``<Q``, document count ``<Q``, then ``int32`` sequence lengths,
``int64`` sequence byte pointers into ``.bin``, and ``int64`` document indices (sequence
numbers where documents start, ``document count`` of them, the first 0 and the last the
sequence count). ``.bin`` holds the sequences' tokens back to back. ferry treats each
sequence as one document.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .errors import MegatronIndexError

__all__ = ["MAGIC", "DTYPE_CODES", "MegatronIndex", "read_index", "write_megatron"]

MAGIC = b"MMIDIDX\x00\x00"
_VERSION = 1
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_HEADER = struct.Struct("<9sQBQQ")


@dataclass(frozen=True)
class MegatronIndex:
    dtype: np.dtype
    lengths: np.ndarray  # int32, one per sequence
    pointers: np.ndarray  # int64 byte offsets into .bin
    doc_indices: np.ndarray


def read_index(prefix: str) -> MegatronIndex:
    """Parse ``prefix.idx`` and check it against ``prefix.bin``'s size."""
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    try:
        with open(idx_path, "rb") as f:
            data = f.read()
        bin_size = os.path.getsize(bin_path)
    except OSError as exc:
        raise MegatronIndexError(f"{prefix}: cannot read .idx/.bin ({exc})") from exc
    if len(data) < _HEADER.size:
        raise MegatronIndexError(f"{idx_path}: too short for a Megatron index header")
    magic, version, code, nseq, ndoc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MegatronIndexError(f"{idx_path}: wrong magic {magic!r} (expected {MAGIC!r}); not an MMIDIDX index")
    if version != _VERSION:
        raise MegatronIndexError(f"{idx_path}: index version {version} is not supported (expected 1)")
    if code not in DTYPE_CODES:
        raise MegatronIndexError(f"{idx_path}: unknown dtype code {code}")
    dtype = np.dtype(DTYPE_CODES[code])
    if not np.issubdtype(dtype, np.integer):
        raise MegatronIndexError(f"{idx_path}: dtype {dtype} is not an integer token type")
    need = _HEADER.size + nseq * 4 + nseq * 8 + ndoc * 8
    if len(data) < need:
        raise MegatronIndexError(f"{idx_path}: {len(data)} bytes, the header promises at least {need}")
    off = _HEADER.size
    lengths = np.frombuffer(data, np.int32, nseq, off)
    off += nseq * 4
    pointers = np.frombuffer(data, np.int64, nseq, off)
    off += nseq * 8
    doc_indices = np.frombuffer(data, np.int64, ndoc, off)
    if nseq and (lengths.min() < 0 or int(pointers[-1]) + int(lengths[-1]) * dtype.itemsize > bin_size):
        raise MegatronIndexError(f"{prefix}: sequence lengths/pointers run past the end of {bin_path}")
    return MegatronIndex(dtype, lengths, pointers, doc_indices)


def write_megatron(prefix: str, documents: Iterable[np.ndarray], dtype: np.dtype) -> int:
    """Write documents as ``prefix.bin`` + ``prefix.idx`` (one sequence per document); returns the count."""
    dtype = np.dtype(dtype)
    code = next((c for c, t in DTYPE_CODES.items() if np.dtype(t) == dtype), None)
    if code is None:
        raise MegatronIndexError(f"dtype {dtype} has no Megatron dtype code")
    lengths: list[int] = []
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(prefix + ".bin", "wb") as out:
        for doc in documents:
            out.write(np.ascontiguousarray(doc, dtype=dtype).tobytes())
            lengths.append(len(doc))
    lens = np.asarray(lengths, dtype=np.int32)
    pointers = np.zeros(len(lens), dtype=np.int64)
    if len(lens) > 1:
        np.cumsum(lens[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_indices = np.arange(len(lens) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(_HEADER.pack(MAGIC, _VERSION, code, len(lens), len(doc_indices)))
        f.write(lens.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_indices.tobytes())
    return len(lens)
