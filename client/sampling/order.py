"""The order in which an epoch visits samples: ``none``, ``global`` or ``window`` shuffle.

Pure index math. Epoch ``e`` visits sample ``order.sample_ids(e, p)`` at position ``p``
of ``[0, n)``; for every epoch this is a bijection of ``[0, n)``.

- ``none``: the identity.
- ``global``: a Feistel bijection of ``[0, n)`` keyed by ``(seed, e)``.
- ``window``: for streaming through a bounded cache. Sample ``i`` *belongs* to the shard
  holding its first token (document mode: its document), so shard ``s`` owns samples
  ``[first[s], first[s + 1])``. The shards are put in the order of a bijection of
  ``[0, S)`` keyed by ``(seed, e, 1)``; consecutive runs of ``window`` shards of that
  order form windows; the samples of window ``w`` are laid out shard after shard and
  then permuted by a bijection keyed by ``(seed, e, 2, w)``. Positions walk the windows
  in order, so at any time only about ``window`` shards (plus the neighbours that
  samples spill into) are needed.

Permutations are computed for chunks of consecutive positions (a few thousand at a
time) and memoised, so the per-batch cost is an index lookup; nothing of size ``n``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from .partition import distinct, span
from .permutation import derive_key, feistel_permute

__all__ = ["SampleOrder", "IdentityOrder", "GlobalOrder", "WindowOrder", "make_order", "SHUFFLE_MODES"]

SHUFFLE_MODES = ("global", "window", "none")
_CHUNK = 4096
_SHARD_SALT = 1
_WINDOW_SALT = 2


class SampleOrder(Protocol):
    """Maps (epoch, positions) to sample ids; a bijection of ``[0, n)`` per epoch."""

    n: int

    def sample_ids(self, epoch: int, positions: np.ndarray) -> np.ndarray: ...


class IdentityOrder:
    """``shuffle="none"``: position ``p`` is sample ``p`` in every epoch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def sample_ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)


class _ChunkedOrder:
    """Memoises the permutation over chunks of consecutive positions."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self._chunks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def _compute(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _chunk(self, epoch: int, c: int) -> np.ndarray:
        key = (epoch, c)
        table = self._chunks.get(key)
        if table is None:
            lo = c * _CHUNK
            table = self._compute(epoch, np.arange(lo, min(self.n, lo + _CHUNK), dtype=np.int64))
            self._chunks[key] = table
            if len(self._chunks) > 16:
                self._chunks.popitem(last=False)
        else:
            self._chunks.move_to_end(key)
        return table

    def sample_ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size == 0:
            return pos.copy()
        lo, hi = span(pos)
        first = lo // _CHUNK
        if first == hi // _CHUNK:
            return self._chunk(epoch, first)[pos - first * _CHUNK]
        chunk = pos // _CHUNK
        out = np.empty_like(pos)
        for c in distinct(chunk):
            sel = chunk == c
            out[sel] = self._chunk(epoch, int(c))[pos[sel] - int(c) * _CHUNK]
        return out


class GlobalOrder(_ChunkedOrder):
    """``shuffle="global"``: a keyed bijection of all samples, new per epoch."""

    def _compute(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        return feistel_permute(positions, self.n, derive_key(self.seed, epoch))


class WindowOrder(_ChunkedOrder):
    """``shuffle="window"``: shard order permuted, samples permuted within windows of ``window`` shards.

    ``first`` has ``S + 1`` entries: shard ``s`` owns samples ``[first[s], first[s + 1])``.
    """

    def __init__(self, first: np.ndarray, seed: int, window: int) -> None:
        first = np.asarray(first, dtype=np.int64)
        super().__init__(int(first[-1] - first[0]), seed)
        if window < 1:
            raise ValueError(f"window must be at least 1 shard, got {window}")
        self.first = first
        self.window = window
        self._layouts: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard order, cumulative samples in that order, window starts) for one epoch; O(shards)."""
        layout = self._layouts.get(epoch)
        if layout is None:
            shards = len(self.first) - 1
            order = feistel_permute(np.arange(shards), shards, derive_key(self.seed, epoch, _SHARD_SALT))
            counts = np.diff(self.first)[order]
            cum = np.zeros(shards + 1, dtype=np.int64)
            np.cumsum(counts, out=cum[1:])
            starts = cum[:: self.window]
            if starts[-1] != cum[-1]:
                starts = np.append(starts, cum[-1])
            layout = (order, cum, starts)
            self._layouts[epoch] = layout
            if len(self._layouts) > 2:
                self._layouts.popitem(last=False)
        return layout

    def windows_from(self, epoch: int, position: int) -> Iterator[list[int]]:
        """The shards of each window of ``epoch``, in reading order, from the window holding ``position``."""
        order, _cum, starts = self._layout(epoch)
        w = max(0, int(np.searchsorted(starts, position, side="right")) - 1)
        for k in range(w, len(starts) - 1):
            yield order[k * self.window : (k + 1) * self.window].tolist()

    def window_starts(self, epoch: int) -> np.ndarray:
        """The position where each window of ``epoch`` begins, then the end: positions
        ``[starts[w], starts[w + 1])`` draw from the at most ``window`` shards of window ``w``."""
        return self._layout(epoch)[2].copy()

    def _compute(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        order, cum, starts = self._layout(epoch)
        win = np.searchsorted(starts, positions, side="right") - 1
        laid = np.empty_like(positions)
        for w in distinct(win):
            sel = win == w
            lo, hi = int(starts[w]), int(starts[w + 1])
            key = derive_key(self.seed, epoch, _WINDOW_SALT, int(w))
            laid[sel] = lo + feistel_permute(positions[sel] - lo, hi - lo, key)
        k = np.searchsorted(cum, laid, side="right") - 1
        return self.first[order[k]] - self.first[0] + (laid - cum[k])


def make_order(shuffle: str, first: np.ndarray, seed: int, window: int) -> SampleOrder:
    """The order for a shuffle mode over samples owned by shards as given by ``first``."""
    n = int(first[-1] - first[0])
    if shuffle == "none":
        return IdentityOrder(n)
    if shuffle == "global":
        return GlobalOrder(n, seed)
    if shuffle == "window":
        return WindowOrder(first, seed, window)
    raise ValueError(f"shuffle must be one of {SHUFFLE_MODES}, got {shuffle!r}")
