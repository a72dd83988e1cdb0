"""Who reads which positions: global batches, rank slices, worker shares. Pure index math.

The loader walks one endless stream of positions (epoch ``e`` covers stream positions
``[e*n, (e+1)*n)``). From stream position ``start`` the ``k``-th global batch is
``[start + k*G, start + (k+1)*G)`` with ``G = batch_size * world_size``; rank ``r``
takes ``[start + k*G + r*batch_size, start + k*G + (r+1)*batch_size)``. DataLoader
worker ``w`` of ``K`` builds the rank's batches ``k ≡ w (mod K)``; the loader delivers
them in order of ``k``, so the output never depends on ``K``.
"""

from __future__ import annotations

import numpy as np

from ferry.shard_tools.errors import InvalidValueError

__all__ = ["global_batch_size", "rank_positions", "worker_batches", "batches_until", "split_stream", "distinct", "span"]


# the bound of a stream position (ferry.client.resume.state.MAX_POSITION, which imports more than this module may)
_POSITION_LIMIT = 2**62


def global_batch_size(batch_size: int, world_size: int) -> int:
    """``G``: samples consumed per step by all ranks together."""
    return batch_size * world_size


def rank_positions(start: int, k: int, batch_size: int, world_size: int, rank: int) -> np.ndarray:
    """Stream positions of rank ``rank``'s ``k``-th batch counted from stream position ``start``."""
    first = start + k * batch_size * world_size + rank * batch_size
    if first + batch_size > _POSITION_LIMIT:  # int64 arithmetic on positions stops being exact
        raise InvalidValueError(f"stream positions must lie in [0, 2**62), got a batch from position {first}")
    return np.arange(first, first + batch_size, dtype=np.int64)


def worker_batches(num_batches: int, num_workers: int, worker: int) -> range:
    """The batch numbers a DataLoader worker builds (round robin; all of them with 0 or 1 workers)."""
    if num_workers <= 1:
        return range(num_batches)
    return range(worker, num_batches, num_workers)


def batches_until(start: int, end: int, batch_size: int, world_size: int) -> int:
    """How many global batches from ``start`` it takes to consume position ``end - 1`` (0 if none)."""
    g = batch_size * world_size
    return max(0, -(-(end - start) // g))


def split_stream(positions: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Stream positions → (epoch, position within the epoch) for an epoch of ``n`` samples."""
    epoch, pos = np.divmod(np.asarray(positions, dtype=np.int64), n)
    return epoch, pos


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values of a batch-sized integer array (the epochs, chunks, windows or sources its positions
    fall in), ascending. Not ``np.unique``: numpy 2 imports ``numpy.ma`` on its first call, inside a loader's
    first epoch, and on a few dozen values a set costs less."""
    return sorted(set(values.tolist()))


def span(values: np.ndarray) -> tuple[int, int]:
    """The smallest and largest of a non-empty integer array. On a batch's few dozen values Python's ``min`` and
    ``max`` of a list cost less than two numpy reductions (measured)."""
    if values.size > 256:
        return int(values.min()), int(values.max())
    items = values.tolist()
    return min(items), max(items)
