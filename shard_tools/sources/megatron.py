"""Megatron ``.bin``/``.idx`` input, planned into fixed ranges of sequences (one per shard)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import MegatronIndexError
from ..format.megatron import read_index
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
    """Sequences ``[start, stop)``; :func:`read_index` has checked them back to back inside ``.bin``."""
    index = read_index(unit.path)
    n = len(index.lengths)
    stop = n if unit.stop is None else unit.stop
    if not 0 <= unit.start <= stop <= n:
        raise MegatronIndexError(
            f"{unit.path}.idx: has {n} sequences, the plan asked for [{unit.start}:{stop}]; "
            "did it change during the pack? Rerun it"
        )
    total = int(index.lengths.sum(dtype=np.int64))
    try:  # an empty .bin cannot be mapped; one shortened since read_index is refused here
        data = np.memmap(unit.path + ".bin", dtype=index.dtype, mode="r", shape=(total,)) if total else None
    except (OSError, ValueError) as exc:
        raise MegatronIndexError(f"{unit.path}.bin: cannot map {total} tokens ({exc}); did it change?") from exc
    step = max(1, options.batch_documents)
    for a in range(unit.start, stop, step):
        b = min(a + step, stop)
        offsets = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(index.lengths[a:b], out=offsets[1:])
        first = int(index.pointers[a]) // index.dtype.itemsize
        tokens = np.zeros(0, index.dtype) if data is None else np.asarray(data[first : first + int(offsets[-1])])
        yield DocBatch(tokens, offsets)
