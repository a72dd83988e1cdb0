"""The reads of a process's coming token batches, planned a block of batches at a time.

Much of what a warm batch costs in Python is paid per call, not per sample: the permutation lookup of its
sample ids, the search for the shards that hold them, and the lists the gather walks. :class:`BlockPlans`
pays it once per block of coming batches. Blocks start at ``FIRST_BLOCK`` batches and double, up to
``MAX_BLOCK`` batches and ``MAX_SAMPLES`` samples, while the reads go on in sequence, so that a loader that
reads a few batches per iteration plans little more than it reads. A block belongs to one sequence of batches
(the key of the loader's plan, which fixes every batch's stream positions) and one sample order; a batch of
anything else plans a new block.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ferry.shard_tools.errors import FerryError

__all__ = ["FIRST_BLOCK", "KEPT", "MAX_BLOCK", "MAX_SAMPLES", "BatchReads", "BlockPlans", "ReadsOf"]

FIRST_BLOCK = 4
MAX_BLOCK = 64  # a 16-sample batch's planned reads: one block holds ~1k samples, ~20 KB of lists
MAX_SAMPLES = 8192  # and at most this many samples: a block's lists of Python ints take ~0.5 MB
KEPT = 8  # sequences with a block kept

#: stream positions -> (shard, offset in the shard, runs on into the next shard) of each sample
ReadsOf = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


class BatchReads(NamedTuple):
    """Where one batch's samples are read: per sample its first token's shard and offset in it."""

    shards: list[int]
    offsets: list[int]
    runs_on: bool  # some sample runs on into the shard(s) after its first one


@dataclass(frozen=True)
class _Block:
    order: object
    first: int  # the block's first batch (index in the sequence)
    count: int
    batch: int  # samples per batch
    shards: list[int]
    offsets: list[int]
    runs_on: list[bool]

    def holds(self, order: object, i: int) -> bool:
        """Whether batch ``i`` of this block's sequence under ``order`` is planned here."""
        return self.order is order and self.first <= i < self.first + self.count


class BlockPlans:
    """The planned reads of the latest block of each of the last ``KEPT`` sequences of batches of one dataset in this
    process (loaders of several ranks may share a dataset object)."""

    def __init__(self) -> None:
        self._blocks: dict[object, _Block] = {}
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[BlockPlans], tuple[()]]:
        """Pickled empty (a DataLoader worker that is not forked plans its own blocks)."""
        return BlockPlans, ()

    def reads(
        self, key: object, order: object, i: int, positions_of: Callable[[int], np.ndarray], reads_of: ReadsOf
    ) -> BatchReads:
        """Batch ``i`` of sequence ``key`` (``positions_of(j)``: the stream positions of its ``j``-th batch) under
        sample ``order`` (compared by identity), planned with its block."""
        block = self._blocks.get(key)
        if block is None or not block.holds(order, i):
            count = FIRST_BLOCK
            if block is not None and block.holds(order, i - block.count):  # the next block of a sequence read on
                count = min(2 * block.count, MAX_BLOCK)
            try:
                block = _plan(order, i, count, positions_of, reads_of)
            except FerryError:  # a later batch of the block has no positions (past the stream's end): this one alone
                block = _plan(order, i, 1, positions_of, reads_of)
            with self._lock:  # loaders in two threads may share the dataset
                self._blocks.pop(key, None)
                if len(self._blocks) >= KEPT:
                    del self._blocks[next(iter(self._blocks))]  # the sequence planned the longest ago
                self._blocks[key] = block
        a = (i - block.first) * block.batch
        b = a + block.batch
        return BatchReads(block.shards[a:b], block.offsets[a:b], block.runs_on[i - block.first])


def _plan(order: object, i: int, count: int, positions_of: Callable[[int], np.ndarray], reads_of: ReadsOf) -> _Block:
    """The reads of batches ``[i, i + count)`` of a sequence, or of fewer: a block holds at most ``MAX_SAMPLES``
    samples (at least one batch)."""
    first = positions_of(i)
    batch = len(first)
    count = max(1, min(count, MAX_SAMPLES // max(batch, 1)))
    positions = [first, *(positions_of(j) for j in range(i + 1, i + count))]
    shards, offsets, runs_on = reads_of(np.concatenate(positions))
    per_batch = [n > 0 for n in np.count_nonzero(np.reshape(runs_on, (count, batch)), axis=1).tolist()]
    return _Block(order, i, count, batch, shards.tolist(), offsets.tolist(), per_batch)
