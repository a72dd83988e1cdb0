"""Megatron-LM indexed datasets (``MMIDIDX``): read and write the ``.idx`` + ``.bin`` pair.

``.idx`` layout (little-endian): magic ``b"MMIDIDX\\x00\\x00"``, version ``<Q`` = 1, dtype code
``<B``, sequence count ``<Q``, document count ``<Q``, then ``int32`` sequence lengths,
``int64`` sequence byte pointers into ``.bin``, and ``int64`` document indices (sequence
numbers where documents start, ``document count`` of them, the first 0 and the last the
sequence count). ``.bin`` holds the sequences' tokens back to back. ferry treats each
sequence as one document.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from ..errors import MegatronIndexError, UsageError

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
_MAX_LENGTH = 2**31 - 1  # sequence lengths are int32


@dataclass(frozen=True)
class MegatronIndex:
    dtype: np.dtype
    lengths: np.ndarray  # int32, one per sequence
    pointers: np.ndarray  # int64 byte offsets into .bin
    doc_indices: np.ndarray


def read_index(prefix: str) -> MegatronIndex:
    """Parse ``prefix.idx`` and check it, whole, against ``prefix.bin`` before any token is read.

    Megatron writes sequences back to back from byte 0, so the index must describe exactly
    that: lengths ≥ 0, ``pointer[0] == 0``, ``pointer[i+1] == pointer[i] + length[i]·itemsize``,
    the last sequence ending at the last byte of ``.bin`` (no missing or trailing bytes), and
    document indices non-decreasing from 0 to the sequence count. Anything else is a
    :class:`MegatronIndexError` naming the file and the first bad sequence."""
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    try:
        with open(idx_path, "rb") as f:
            _regular(idx_path, os.fstat(f.fileno()))  # /dev/zero or a FIFO would be read without end
            data = f.read()
        bin_stat = os.stat(bin_path)
    except OSError as exc:
        raise MegatronIndexError(f"{prefix}: cannot read .idx/.bin ({exc})") from exc
    _regular(bin_path, bin_stat)
    bin_size = bin_stat.st_size
    dtype, nseq, ndoc = _parse_header(idx_path, data)
    off = _HEADER.size
    lengths = np.frombuffer(data, np.int32, nseq, off)
    off += nseq * 4
    pointers = np.frombuffer(data, np.int64, nseq, off)
    off += nseq * 8
    doc_indices = np.frombuffer(data, np.int64, ndoc, off)
    _check_sequences(idx_path, bin_path, bin_size, dtype.itemsize, lengths, pointers)
    _check_documents(idx_path, nseq, doc_indices)
    return MegatronIndex(dtype, lengths, pointers, doc_indices)


def _regular(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise MegatronIndexError(
            f"{path}: not a regular file (a device, FIFO or directory); give a Megatron .idx/.bin pair"
        )


def _parse_header(idx_path: str, data: bytes) -> tuple[np.dtype, int, int]:
    """Magic, version, dtype and counts; the counts must account for every byte of the file."""
    if len(data) < _HEADER.size:
        raise MegatronIndexError(f"{idx_path}: {len(data)} bytes, too short for a Megatron index header")
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
    need = _HEADER.size + nseq * 12 + ndoc * 8
    if len(data) != need:
        extra = " (multimodal indexes with sequence modes are not supported)" if len(data) > need else ""
        raise MegatronIndexError(
            f"{idx_path}: {len(data)} bytes, but a header of {nseq} sequences and {ndoc} documents "
            f"needs exactly {need}{extra}; the index is truncated or corrupt, rebuild it"
        )
    return dtype, nseq, ndoc


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _check_sequences(
    idx_path: str, bin_path: str, bin_size: int, itemsize: int, lengths: np.ndarray, pointers: np.ndarray
) -> None:
    """Every sequence inside ``.bin``, contiguous from byte 0 to its end (vectorised: indexes are large)."""
    where = f"{idx_path} does not match {bin_path} ({bin_size} bytes)"
    if bin_size % itemsize:
        raise MegatronIndexError(f"{bin_path}: {bin_size} bytes is not a whole number of {itemsize}-byte tokens")
    if len(lengths) == 0:
        if bin_size:
            raise MegatronIndexError(f"{where}: the index has no sequences but .bin is not empty")
        return
    if _is_back_to_back(bin_size, itemsize, lengths, pointers):
        return
    # something is wrong: find the first bad sequence and say how
    if (bad := lengths < 0).any():
        i = _first(bad)
        raise MegatronIndexError(f"{where}: sequence {i} has negative length {int(lengths[i])}")
    if (bad := (pointers < 0) | (pointers > bin_size)).any():
        i = _first(bad)
        raise MegatronIndexError(f"{where}: sequence {i} starts at byte {int(pointers[i])}, outside .bin")
    ends = pointers + lengths.astype(np.int64) * itemsize  # no overflow: pointers ≤ bin_size, lengths < 2**31
    if (bad := ends > bin_size).any():
        i = _first(bad)
        raise MegatronIndexError(
            f"{where}: sequence {i} (byte {int(pointers[i])}, {int(lengths[i])} tokens) runs past the end of .bin"
        )
    if pointers[0] != 0:
        raise MegatronIndexError(f"{where}: sequence 0 starts at byte {int(pointers[0])}, not 0")
    if (bad := pointers[1:] != ends[:-1]).any():
        i = _first(bad)
        raise MegatronIndexError(
            f"{where}: sequence {i + 1} starts at byte {int(pointers[i + 1])} but sequence {i} ends at byte "
            f"{int(ends[i])}; sequences must be back to back"
        )
    if ends[-1] != bin_size:
        raise MegatronIndexError(
            f"{where}: the last sequence ({len(lengths) - 1}) ends at byte {int(ends[-1])}, "
            f"leaving {bin_size - int(ends[-1])} trailing bytes"
        )


def _is_back_to_back(bin_size: int, itemsize: int, lengths: np.ndarray, pointers: np.ndarray) -> bool:
    """The common, honest case in few passes: pointers are the running sum of lengths · itemsize
    and the sum is the size of ``.bin``."""
    lo, hi = int(lengths.min()), int(lengths.max())
    if lo < 0 or hi * len(lengths) * itemsize >= 2**63:  # the int64 running sum could wrap
        return False
    expected = np.empty(len(lengths), dtype=np.int64)
    expected[0] = 0
    np.cumsum(lengths[:-1], dtype=np.int64, out=expected[1:])
    expected *= itemsize
    return bool(np.array_equal(expected, pointers)) and int(expected[-1]) + int(lengths[-1]) * itemsize == bin_size


def _check_documents(idx_path: str, nseq: int, doc_indices: np.ndarray) -> None:
    if len(doc_indices) == 0 or doc_indices[0] != 0 or doc_indices[-1] != nseq:
        raise MegatronIndexError(
            f"{idx_path}: document indices must run from 0 to the sequence count {nseq}; the index is corrupt"
        )
    if (bad := doc_indices[1:] < doc_indices[:-1]).any():
        i = _first(bad) + 1
        raise MegatronIndexError(
            f"{idx_path}: document {i} starts at sequence {int(doc_indices[i])}, before document {i - 1}; "
            "the index is corrupt"
        )


def write_megatron(prefix: str, documents: Iterable[np.ndarray], dtype: np.dtype) -> int:
    """Write documents as ``prefix.bin`` + ``prefix.idx`` (one sequence per document); returns the count.

    Both files are written to temporary names beside the targets, fsynced, then renamed into
    place, ``.idx`` last: an error while writing leaves a previous pair as it was and no
    temporary file behind. Only a crash between the two renames can pair the new ``.bin``
    with the old ``.idx``, which :func:`read_index` refuses unless their sizes agree."""
    dtype = np.dtype(dtype)
    code = next((c for c, t in DTYPE_CODES.items() if np.dtype(t) == dtype), None)
    if code is None:
        raise MegatronIndexError(f"dtype {dtype} has no Megatron dtype code")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    for target in (prefix + ".bin", prefix + ".idx"):
        if os.path.isdir(target):  # caught before writing: a failed rename would split the pair
            raise UsageError(f"{target} is a directory; choose another export prefix")
    tag = f".tmp-{os.getpid()}-{secrets.token_hex(4)}"
    bin_tmp, idx_tmp = prefix + ".bin" + tag, prefix + ".idx" + tag
    try:
        with open(bin_tmp, "xb") as out:
            lens = _write_tokens(out, documents, dtype, prefix)
            _sync(out)
        pointers = np.zeros(len(lens), dtype=np.int64)
        if len(lens) > 1:
            np.cumsum(lens[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
        doc_indices = np.arange(len(lens) + 1, dtype=np.int64)
        with open(idx_tmp, "xb") as f:
            f.write(_HEADER.pack(MAGIC, _VERSION, code, len(lens), len(doc_indices)))
            f.write(lens.tobytes())
            f.write(pointers.tobytes())
            f.write(doc_indices.tobytes())
            _sync(f)
        os.replace(bin_tmp, prefix + ".bin")
        os.replace(idx_tmp, prefix + ".idx")
    except BaseException:
        for tmp in (bin_tmp, idx_tmp):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    _sync_dir(os.path.dirname(os.path.abspath(prefix)))
    return len(lens)


def _write_tokens(out: BinaryIO, documents: Iterable[np.ndarray], dtype: np.dtype, prefix: str) -> np.ndarray:
    lengths: list[int] = []
    for doc in documents:
        if len(doc) > _MAX_LENGTH:
            raise MegatronIndexError(
                f"{prefix}: document {len(lengths)} has {len(doc)} tokens, more than a Megatron index can hold "
                f"({_MAX_LENGTH})"
            )
        out.write(np.ascontiguousarray(doc, dtype=dtype).tobytes())
        lengths.append(len(doc))
    return np.asarray(lengths, dtype=np.int32)


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())


def _sync_dir(path: str) -> None:
    """Make the renames durable; some filesystems cannot fsync a directory, which is fine."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
