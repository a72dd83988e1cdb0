"""``MixedDataset``: several sample sources drawn by weight, each position's source a pure function of it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shard_tools.errors import UsageError

from .checks import show
from .schedule import Schedule
from .source import SampleSource

__all__ = ["MixedDataset"]


class MixedDataset(SampleSource):
    """Several datasets drawn by weight; position ``p``'s source is a pure function of ``p``.

    Each source keeps its own endless stream (its own epochs and shuffle); an epoch of the
    mixture is defined as the sum of the sources' sample counts. ``weights`` is one weight per
    dataset, or a schedule: a list of phases ``(start, weights)`` — from global sample ``start``
    (the first phase at 0) on, draw with these weights (0 leaves a dataset out of the phase).
    """

    def __init__(self, datasets: Sequence[SampleSource], weights: Sequence[Any]) -> None:
        phases = _phases(datasets, weights)
        lengths = {d.seq_len for d in datasets}
        modes = {d.mode for d in datasets}
        if len(lengths) != 1 or len(modes) != 1:
            raise UsageError(f"mixed datasets must share seq_len and mode, got {sorted(lengths)} / {sorted(modes)}")
        try:
            self.schedule = Schedule.from_weights(phases)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        self.sources = list(datasets)
        self.seq_len = lengths.pop()
        self.mode = modes.pop()
        self.token_dtype = np.result_type(*[d.token_dtype for d in datasets])
        self.num_samples = sum(d.num_samples for d in datasets)
        self.prefetch_depth = max(d.prefetch_depth for d in datasets)

    def __repr__(self) -> str:
        if len(self.schedule.phases) == 1:
            return f"MixedDataset({self.sources!r}, weights={self.schedule.weights})"
        return f"MixedDataset({self.sources!r}, phases={self.schedule.phases})"

    def identity(self) -> dict[str, Any]:
        idents = [d.identity() for d in self.sources]
        ident = {
            "dataset_version": [i["dataset_version"] for i in idents],
            "seed": [i["seed"] for i in idents],
            "seq_len": self.seq_len,
            "quota": self.schedule.quota.tolist(),
            "sources": idents,
        }
        if len(self.schedule.phases) > 1:  # a single phase keeps the identity (and states) of a plain mixture
            ident["phases"] = [[s, list(q)] for s, q in self.schedule.phases]
        return ident

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


def _phases(datasets: Any, weights: Any) -> list[tuple[int, list[float]]]:
    """``weights`` as a list of phases ``(start, weights)``: one phase from 0 for a plain list of weights."""
    for name, value in (("datasets", datasets), ("weights", weights)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise UsageError(f"mix takes a list of {name}, got {show(value)}")
    if not datasets:
        raise UsageError("mix needs at least one dataset")
    for d in datasets:
        if not isinstance(d, SampleSource):
            raise UsageError(f"mix takes TokenDatasets (or MixedDatasets), got {show(d)}")
    if weights and all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[1], Sequence) for p in weights):
        phases = [(_start(s), _weights(datasets, w, zero_ok=True)) for s, w in weights]
        if phases[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(phases, phases[1:], strict=False)):
            raise UsageError(f"a schedule's phase starts must increase from 0, got {[s for s, _ in phases]}")
        return phases
    return [(0, _weights(datasets, weights, zero_ok=False))]


def _start(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise UsageError(f"a phase starts at a global sample number (an integer >= 0), got {show(value)}")
    return int(value)


def _weights(datasets: Sequence[Any], weights: Any, *, zero_ok: bool) -> list[float]:
    """As many real, finite weights as datasets: positive (or, in a phase of a schedule, zero; one positive)."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != len(datasets):
        n = len(weights) if isinstance(weights, Sequence) else show(weights)
        raise UsageError(f"mix needs one weight per dataset ({len(datasets)} datasets, {n} weights)")
    for w in weights:
        real = isinstance(w, (int, float, np.integer, np.floating)) and not isinstance(w, (bool, np.bool_))
        if not real or not np.isfinite(w) or w < 0 or (w == 0 and not zero_ok):
            raise UsageError(f"mixing weights must be positive finite numbers, got {show(list(weights))}")
    if not any(w > 0 for w in weights):
        raise UsageError(f"every phase of a schedule needs a positive weight, got {show(list(weights))}")
    return [float(w) for w in weights]
