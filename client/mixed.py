"""``MixedDataset``: several sample sources drawn by weight, each position's source a pure function of it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shard_tools.errors import UsageError

from .checks import show
from .mixing import MixSchedule
from .source import SampleSource

__all__ = ["MixedDataset"]


class MixedDataset(SampleSource):
    """Several datasets drawn by weight; position ``p``'s source is a pure function of ``p``.

    Each source keeps its own endless stream (its own epochs and shuffle); an epoch of the
    mixture is defined as the sum of the sources' sample counts.
    """

    def __init__(self, datasets: Sequence[SampleSource], weights: Sequence[float]) -> None:
        _check_args(datasets, weights)
        lengths = {d.seq_len for d in datasets}
        modes = {d.mode for d in datasets}
        if len(lengths) != 1 or len(modes) != 1:
            raise UsageError(f"mixed datasets must share seq_len and mode, got {sorted(lengths)} / {sorted(modes)}")
        try:
            self.schedule = MixSchedule(list(weights))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        self.sources = list(datasets)
        self.seq_len = lengths.pop()
        self.mode = modes.pop()
        self.token_dtype = np.result_type(*[d.token_dtype for d in datasets])
        self.num_samples = sum(d.num_samples for d in datasets)
        self.prefetch_depth = max(d.prefetch_depth for d in datasets)

    def __repr__(self) -> str:
        return f"MixedDataset({self.sources!r}, weights={self.schedule.weights})"

    def identity(self) -> dict[str, Any]:
        idents = [d.identity() for d in self.sources]
        return {
            "dataset_version": [i["dataset_version"] for i in idents],
            "seed": [i["seed"] for i in idents],
            "seq_len": self.seq_len,
            "quota": self.schedule.quota.tolist(),
            "sources": idents,
        }

    def _split(self, positions: np.ndarray) -> Iterator[tuple[SampleSource, np.ndarray, np.ndarray]]:
        src, idx = self.schedule.locate(positions)
        for j in np.unique(src).tolist():
            sel = np.nonzero(src == j)[0]
            yield self.sources[j], idx[sel], sel

    def fill(self, positions: np.ndarray, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        for source, idx, sel in self._split(positions):
            source.fill(idx, rows[sel], out)

    def boundaries(self, positions: np.ndarray) -> list[list[int]]:
        result: list[list[int]] = [[] for _ in range(len(positions))]
        for source, idx, sel in self._split(positions):
            for i, b in zip(sel.tolist(), source.boundaries(idx), strict=True):
                result[i] = b
        return result

    def prefetch(self, positions: np.ndarray) -> None:
        for source, idx, _ in self._split(positions):
            source.prefetch(idx)

    def close(self) -> None:
        for d in self.sources:
            d.close()


def _check_args(datasets: Any, weights: Any) -> None:
    """A non-empty list of sample sources and as many real, finite, positive weights (bool is no weight)."""
    for name, value in (("datasets", datasets), ("weights", weights)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise UsageError(f"mix takes a list of {name}, got {show(value)}")
    if len(datasets) != len(weights) or not datasets:
        raise UsageError(f"mix needs one weight per dataset ({len(datasets)} datasets, {len(weights)} weights)")
    for d in datasets:
        if not isinstance(d, SampleSource):
            raise UsageError(f"mix takes TokenDatasets (or MixedDatasets), got {show(d)}")
    for w in weights:
        real = isinstance(w, (int, float, np.integer, np.floating)) and not isinstance(w, (bool, np.bool_))
        if not real or not np.isfinite(w) or w <= 0:
            raise UsageError(f"mixing weights must be positive finite numbers, got {show(list(weights))}")
