"""Megatron ``.bin``/``.idx`` input, planned into fixed ranges of sequences (one per shard)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..megatron import read_index
from .base import DocBatch, SourceOptions, Unit

__all__ = ["plan_megatron", "read_megatron"]


def plan_megatron(prefix: str, options: SourceOptions) -> list[Unit]:
    """Split the sequences into ranges of exactly one shard each.

    A unit's cost is counted as the shard cutter counts raw bytes (tokens incl. EOS times the
    stored item size, plus 4 offset bytes per document), and ends at the first sequence where
    it reaches ``shard_size`` — so every unit packs into one full shard, with no remainder."""
    index = read_index(prefix)
    n = len(index.lengths)
    if n == 0:
        return [Unit(path=prefix, format="megatron", start=0, stop=0)]
    per_doc = options.token_itemsize * int(options.eos_appended) + 4
    cost = np.cumsum(index.lengths.astype(np.int64) * options.token_itemsize + per_doc)
    units, start = [], 0
    while start < n:
        base = cost[start - 1] if start else 0
        stop = int(np.searchsorted(cost, base + options.shard_size, side="left")) + 1
        stop = min(max(stop, start + 1), n)
        units.append(Unit(path=prefix, format="megatron", start=start, stop=stop))
        start = stop
    return units


def read_megatron(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    index = read_index(unit.path)
    stop = len(index.lengths) if unit.stop is None else unit.stop
    data = np.memmap(unit.path + ".bin", dtype=index.dtype, mode="r")
    step = max(1, options.batch_documents)
    for a in range(unit.start, stop, step):
        b = min(a + step, stop)
        lengths = index.lengths[a:b].astype(np.int64)
        starts = index.pointers[a:b] // index.dtype.itemsize
        offsets = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        contiguous = bool(np.all(starts[1:] == starts[:-1] + lengths[:-1]))
        if contiguous:
            tokens = np.asarray(data[starts[0] : starts[0] + offsets[-1]])
        else:
            tokens = np.concatenate([np.asarray(data[s : s + n]) for s, n in zip(starts, lengths, strict=False)])
        yield DocBatch(tokens, offsets)
