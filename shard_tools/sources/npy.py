"""NumPy ``.npy`` input: a 1-D token stream split on EOS, or an object array of documents.

NumPy stores object arrays pickled, and a pickle can name any function to call: they are read
by :mod:`.npyobject`, which builds only what ``np.save`` writes for arrays of documents.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import InputFormatError, TokenRangeError, UsageError
from .base import DocBatch, SourceOptions, Unit, batch_from_lists
from .npyobject import Refused, load_object_array

__all__ = ["read_npy"]

SCAN_BLOCK = 1 << 24  # tokens scanned for EOS at a time: bounded memory on huge streams
_MAGIC = b"\x93NUMPY"
_INT64_MAX = 2**63 - 1
# 3.0 differs from 2.0 only in encoding field names as UTF-8, which does not change whether the
# dtype holds objects
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
    (3, 0): np.lib.format.read_array_header_2_0,
}


def read_npy(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    arr = _load(unit.path)
    if arr.dtype == object:
        yield from _object_docs(unit.path, arr, options)
    elif arr.ndim == 1 and np.issubdtype(arr.dtype, np.integer):
        if options.eos_id is None:
            raise UsageError(f"{unit.path}: splitting a 1-D token stream into documents needs --eos-id")
        yield from _split_stream(arr, options.eos_id)
    else:
        raise InputFormatError(
            f"{unit.path}: expected a 1-D integer token stream or an object array of documents, "
            f"found shape {arr.shape} dtype {arr.dtype}"
        )


def _load(path: str) -> np.ndarray:
    """Map a plain array; unpickle (with :func:`.npyobject.load_object_array`) only an array whose header
    says object dtype. A file without the ``.npy`` magic is refused first: ``np.load`` would
    open zip archives and unpickle arbitrary files. A plain array that cannot be mapped
    (truncated) is an error, never read into memory whole."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                raise InputFormatError(f"{path}: not a .npy file (no NumPy magic at its start)")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version not in _HEADER_READERS:
                raise InputFormatError(f"{path}: .npy format version {version} is not supported")
            has_object = _HEADER_READERS[version](f)[2].hasobject
            arr = load_object_array(f) if has_object else np.load(path, mmap_mode="r")
    except InputFormatError:
        raise
    except Refused as exc:
        raise InputFormatError(f"{path}: not loaded: {exc}") from exc
    except Exception as exc:  # unpickling can raise any type
        raise InputFormatError(
            f"{path}: not a readable .npy file ({type(exc).__name__}: {exc}); is it truncated or corrupt?"
        ) from exc
    if not isinstance(arr, np.ndarray):
        raise InputFormatError(f"{path}: not a .npy array (found {type(arr).__name__})")
    return arr


def _object_docs(path: str, arr: np.ndarray, options: SourceOptions) -> Iterator[DocBatch]:
    docs: list[np.ndarray] = []
    for i, item in enumerate(arr.reshape(-1)):
        docs.append(_document(path, i, item))
        if len(docs) >= options.batch_documents:
            yield batch_from_lists(docs)
            docs = []
    if docs:
        yield batch_from_lists(docs)


def _document(path: str, i: int, item: object) -> np.ndarray:
    """One element of an object array as int64 token ids, or an InputFormatError naming it."""
    try:
        doc = np.asarray(item)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged nested lists, odd objects
        raise InputFormatError(f"{path}: document {i} is not a 1-D integer array ({exc})") from exc
    if doc.ndim != 1 or not (np.issubdtype(doc.dtype, np.integer) or doc.size == 0):
        raise InputFormatError(f"{path}: document {i} is not a 1-D integer array (shape {doc.shape}, {doc.dtype})")
    if doc.dtype == np.uint64 and doc.size and int(doc.max()) > _INT64_MAX:  # would wrap to a negative id
        raise TokenRangeError(f"{path}: token id {int(doc.max())} in document {i} does not fit in 64 bits")
    return doc.astype(np.int64, copy=False)


def _split_stream(arr: np.ndarray, eos_id: int) -> Iterator[DocBatch]:
    """Documents end at each EOS (dropped; packing appends its own); a tail without EOS is a document."""
    start = 0  # start of the current (unfinished) document
    n = arr.shape[0]
    for block_start in range(0, n, SCAN_BLOCK):
        block = np.asarray(arr[block_start : block_start + SCAN_BLOCK])
        ends = np.flatnonzero(block == eos_id) + block_start
        if len(ends) == 0:
            continue
        starts = np.concatenate(([start], ends[:-1] + 1))
        lengths = ends - starts
        tokens = np.asarray(arr[start : ends[-1] + 1])
        keep = np.ones(tokens.shape[0], dtype=bool)
        keep[ends - start] = False
        offsets = np.zeros(len(ends) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        yield DocBatch(tokens[keep], offsets)
        start = int(ends[-1]) + 1
    if start < n:
        tail = np.asarray(arr[start:])
        yield DocBatch(tail, np.array([0, tail.shape[0]], dtype=np.int64))
