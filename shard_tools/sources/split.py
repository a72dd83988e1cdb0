"""Planning large inputs into sub-units, so one big file can use several pack workers.

A file is cut only when it holds at least two *split sizes* of input (see :func:`split_size`:
enough for 8 full shards each), into ``size // split`` pieces of about equal size, each at
least one split size:

- plain JSON Lines / text (``--lines``): byte ranges; each cut is moved forward to just after
  the next newline, found by scanning no further than the next nominal cut (a cut inside a line
  longer than that is dropped);
- zstd-compressed JSON Lines / text: runs of whole zstd frames (local files with more than one
  frame); frames need not end at a newline, so readers apply the ownership rule of
  :mod:`.ranges`;
- Parquet: runs of row groups, sized by the estimated raw token bytes (token ids) or the
  uncompressed text bytes of the column.

Everything here depends only on the file (its size, newline positions near each cut, frame
headers, row-group metadata) and the options, never on the number of workers. A probe that
fails (unreadable file, no such column, not a clean run of zstd frames) leaves the file one
unit, whose reader then reports the problem as for any input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import infer_compression

from .base import SourceOptions, Unit

__all__ = [
    "MIN_SPLIT_BYTES",
    "SPLIT_SHARDS",
    "INPUT_BYTES_PER_RAW",
    "split_size",
    "plan_file",
    "even_cuts",
    "group_runs",
    "zstd_frames",
]

MIN_SPLIT_BYTES = 64 * 2**20
SPLIT_SHARDS = 8  # a sub-unit should make at least this many shards
# Tokenized text and JSON token-id lists take about half as many raw shard bytes as input bytes,
# so inputs measured in their own bytes get sub-units this many times larger.
INPUT_BYTES_PER_RAW = 2
_SCAN = 1 << 16
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)


def split_size(options: SourceOptions, *, raw: bool = False) -> int:
    """The least size of a sub-unit: in input bytes, or with ``raw`` in estimated raw shard bytes
    (Parquet token ids). Each sub-unit ends with one partial shard, so it should make several
    full ones (``SPLIT_SHARDS``); tiny pieces are not worth a task (``MIN_SPLIT_BYTES``)."""
    if options.split_size is not None:
        return max(1, options.split_size)
    shards = SPLIT_SHARDS if raw else SPLIT_SHARDS * INPUT_BYTES_PER_RAW
    return max(MIN_SPLIT_BYTES, shards * options.shard_size)


def even_cuts(size: int, split: int) -> list[int]:
    """Nominal cut offsets of ``size`` bytes into ``size // split`` equal pieces (none below 2)."""
    n = size // split
    return [size * k // n for k in range(1, n)] if n >= 2 else []


def group_runs(sizes: Sequence[int], split: int) -> list[tuple[int, int]]:
    """Consecutive runs ``[a, b)`` of items (row groups, frames) of about equal total size, one
    per ``split`` of the total: run ``k`` ends at the first item where the running total
    reaches ``k/n`` of it. A single run when the total is below two splits."""
    total = int(sum(sizes))
    n = total // split
    if n < 2 or len(sizes) < 2:
        return [(0, len(sizes))]
    cum = np.cumsum(np.asarray(sizes, dtype=np.int64))
    bounds = [0]
    for k in range(1, n):
        b = int(np.searchsorted(cum, total * k // n, side="left")) + 1
        if bounds[-1] < b < len(sizes):
            bounds.append(b)
    bounds.append(len(sizes))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def plan_file(path: str, fmt: str, size: int, options: SourceOptions) -> list[Unit]:
    """The units of one input file of ``size`` bytes: itself, or its sub-units."""
    whole = [Unit(path=path, format=fmt)]
    if fmt == "parquet":
        return _plan_parquet(path, size, split_size(options, raw=options.tokenizer is None), options) or whole
    split = split_size(options)
    if fmt not in ("jsonl", "text") or (fmt == "text" and not options.text_per_line):
        return whole  # one document per text file: nothing to cut
    compression = infer_compression(path)
    if compression is None and size >= 2 * split:
        return _plan_bytes(path, fmt, size, split, options) or whole
    if compression == "zstd" and size >= split // 4:  # a guess at the smallest zstd file worth a look
        return _plan_zstd(path, fmt, size, split, options) or whole
    return whole  # gzip, bz2, xz: one stream that can only be read from its start


def _open_raw(path: str, options: SourceOptions) -> tuple[Any, IO[bytes]]:
    fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
    return fs, fs.open(root, "rb")


def _plan_bytes(path: str, fmt: str, size: int, split: int, options: SourceOptions) -> list[Unit] | None:
    nominal = even_cuts(size, split)
    cuts: list[int] = []
    try:
        _, f = _open_raw(path, options)
        with f:
            for k, at in enumerate(nominal):
                limit = nominal[k + 1] if k + 1 < len(nominal) else size
                cut = _line_start(f, at, limit)
                if cut is not None:
                    cuts.append(cut)
    except OSError:
        return None
    bounds = [0, *cuts, size]
    return [
        Unit(path=path, format=fmt, start=a, stop=b, span="bytes") for a, b in zip(bounds, bounds[1:], strict=False)
    ]


def _line_start(f: IO[bytes], at: int, limit: int) -> int | None:
    """The first line start in ``[at, limit)`` (a line starts after each ``\\n``), or None."""
    pos = at - 1  # the byte before ``at``: a newline there makes ``at`` itself a line start
    f.seek(pos)
    while pos < limit - 1:
        block = f.read(min(_SCAN, limit - 1 - pos))
        if not block:
            return None
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)
    return None


def _plan_zstd(path: str, fmt: str, size: int, split: int, options: SourceOptions) -> list[Unit] | None:
    fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
    if not isinstance(fs, LocalFileSystem):
        return None  # walking block headers would fetch most of a remote file
    try:
        with open(root, "rb") as f:
            frames = zstd_frames(f, size)
    except OSError:
        return None
    if frames is None or len(frames) < 2:
        return None
    # decompressed sizes where the frames declare them, else (an underestimate) compressed ones
    weights: list[int] = [length if content is None else content for _, length, content in frames]
    runs = group_runs(weights, split)
    if len(runs) < 2:
        return None
    ends = [off + length for off, length, _ in frames]
    return [Unit(path=path, format=fmt, start=frames[a][0], stop=ends[b - 1], span="zstd_frames") for a, b in runs]


def zstd_frames(f: IO[bytes], size: int) -> list[tuple[int, int, int | None]] | None:
    """``(offset, compressed length, content size or None)`` of each frame of a zstd file, from
    its frame and block headers (RFC 8878), or None if it is not a clean sequence of frames."""
    frames: list[tuple[int, int, int | None]] = []
    pos = 0
    while pos < size:
        f.seek(pos)
        head = f.read(18)
        if len(head) < 8:
            return None
        magic = int.from_bytes(head[:4], "little")
        content: int | None
        if magic in _SKIPPABLE:
            end, content = pos + 8 + int.from_bytes(head[4:8], "little"), 0
        elif magic == _ZSTD_MAGIC:
            parsed = _frame_end(f, pos, head)
            if parsed is None:
                return None
            end, content = parsed
        else:
            return None
        if end > size:
            return None
        frames.append((pos, end - pos, content))
        pos = end
    return frames


def _frame_end(f: IO[bytes], pos: int, head: bytes) -> tuple[int, int | None] | None:
    """End offset and declared content size of the zstd frame at ``pos`` (header in ``head``)."""
    fhd = head[4]
    fcs_flag, single, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    if fhd & 0x08:  # reserved bit
        return None
    did_size = (0, 1, 2, 4)[did_flag]
    fcs_size = (single, 2, 4, 8)[fcs_flag]
    fcs_at = 5 + (0 if single else 1) + did_size
    content: int | None = None
    if fcs_size:
        content = int.from_bytes(head[fcs_at : fcs_at + fcs_size], "little") + (256 if fcs_size == 2 else 0)
    p = pos + fcs_at + fcs_size
    while True:  # blocks: a 3-byte header each (last flag, type, size)
        f.seek(p)
        bh = f.read(3)
        if len(bh) < 3:
            return None
        value = int.from_bytes(bh, "little")
        last, kind, bsize = value & 1, (value >> 1) & 3, value >> 3
        if kind == 3:
            return None
        p += 3 + (1 if kind == 1 else bsize)
        if last:
            return p + 4 * checksum, content


def _plan_parquet(path: str, size: int, split: int, options: SourceOptions) -> list[Unit] | None:
    if size < split // 4:  # reading every small file's footer would slow planning for nothing
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = options.text_column if options.tokenizer is not None else options.tokens_column
    try:
        _, f = _open_raw(path, options)
        with f:
            meta = pq.ParquetFile(f).metadata
    except (pa.ArrowException, OSError):
        return None
    if meta.num_row_groups < 2:
        return None
    rows, weights = [], []
    per_doc = 4 + options.token_itemsize * int(options.eos_appended)
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        chunks = [rg.column(j) for j in range(rg.num_columns)]
        mine = [c for c in chunks if c.path_in_schema == column or c.path_in_schema.startswith(column + ".")]
        if not mine:
            return None
        rows.append(rg.num_rows)
        if options.tokenizer is None:  # token ids: estimate the raw shard bytes as the cutter counts them
            weights.append(mine[0].num_values * options.token_itemsize + rg.num_rows * per_doc)
        else:
            weights.append(sum(c.total_uncompressed_size for c in mine))
    runs = group_runs(weights, split)
    if len(runs) < 2:
        return None
    first = np.concatenate(([0], np.cumsum(rows, dtype=np.int64)))
    return [
        Unit(path=path, format="parquet", start=a, stop=b, span="row_groups", first_document=int(first[a]))
        for a, b in runs
    ]
