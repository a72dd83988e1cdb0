"""``MediaMixture``: media datasets (and datasets without media) drawn by weight, position by position.

The schedule is the text loader's (:class:`ferry.client.sampling.schedule.Schedule`): stream position ``p``
draws from source ``j`` and is position ``i`` of that source's own stream, a pure function of ``p``, with every
prefix of a phase holding each source in its proportion within one sequence and each period of it exactly. Each
source is read as an endless stream of its packed sequences (its epochs back to back, its own ``epochs`` left
aside), so the mixture's sequences do not depend on ranks, workers or batch size, and a state (the position with
where each source stands) resumes it exactly, with any of them changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ferry.shard_tools.errors import InvalidValueError, StateError, UsageError

from ..sampling.mixing import check_weights
from ..sampling.schedule import Schedule
from .dataset import MediaDataset
from .source import POSITION_LIMIT, MediaSource, check_shape

__all__ = ["MediaMixture"]


class MediaMixture(MediaSource):
    """Sequences of several :class:`MediaDataset` sources drawn by weight (see the module docstring).

    Args:
        datasets: the sources, all of one ``seq_len`` (a dataset packed without media is a text source).
        weights: one weight per source, or a schedule: phases ``(start, weights)`` from stream position ``start``
            on (the first at 0; a weight of 0 leaves a source out of a phase).
        sequences: sequences to read over all ranks (None: without end).
        rank, world_size: this rank's share of the stream (:mod:`ferry.client.media.source`).
    """

    def __init__(
        self,
        datasets: Sequence[MediaDataset],
        weights: Sequence[Any],
        *,
        sequences: int | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if isinstance(datasets, (str, bytes)) or not isinstance(datasets, Sequence) or not datasets:
            raise UsageError(f"MediaMixture takes a list of MediaDatasets, got {datasets!r}")
        if not all(isinstance(d, MediaDataset) for d in datasets):
            raise UsageError("MediaMixture takes MediaDatasets (a text dataset is read as MediaDataset too)")
        lengths = sorted({d.seq_len for d in datasets})
        if len(lengths) != 1:
            raise UsageError(f"mixed datasets must share seq_len, got {lengths}")
        if sequences is not None and (isinstance(sequences, bool) or not 0 <= sequences < POSITION_LIMIT):
            raise UsageError(f"sequences must be a count in [0, 2**62) or None, got {sequences!r}")
        check_shape(rank, world_size)
        try:
            self.schedule = Schedule.from_weights(_phases(len(datasets), weights))
        except InvalidValueError:
            raise
        except ValueError as exc:
            raise InvalidValueError(str(exc)) from exc
        self.sources = list(datasets)
        self.seq_len = lengths[0]
        self.sequences, self.rank, self.world_size = sequences, rank, world_size
        self.start = 0

    def __repr__(self) -> str:
        return f"MediaMixture({len(self.sources)} sources, phases={self.schedule.phases})"

    def _locate(self, positions: Iterable[int]) -> tuple[list[int], list[int]]:
        src, idx = self.schedule.locate(np.asarray(list(positions), dtype=np.int64))
        return src.tolist(), idx.tolist()

    def sample_at(self, position: int) -> dict[str, Any]:
        (j,), (i,) = self._locate([position])
        return {**self.sources[j].sample_at(i), "position": position, "source": j, "source_position": i}

    def prefetch_at(self, positions: Iterable[int]) -> None:
        src, idx = self._locate(positions)
        for j, source in enumerate(self.sources):
            mine = [i for s, i in zip(src, idx, strict=True) if s == j]
            if mine:
                source.prefetch_at(mine)

    def ended(self, position: int) -> bool:
        return self.sequences is not None and position >= self.sequences

    def fingerprint(self) -> list[Any]:
        phases = [[s, list(q)] for s, q in self.schedule.phases]
        return ["mixture", phases, [d.fingerprint() for d in self.sources]]

    def anchors(self, position: int) -> list[list[int]]:
        drawn = self.schedule.drawn(position).tolist()
        return [list(d.epochs_index.anchor(n)) for d, n in zip(self.sources, drawn, strict=True)]

    def adopt(self, anchors: Any, position: int) -> None:
        if not isinstance(anchors, list) or len(anchors) != len(self.sources):
            raise StateError(f"a mixture's state has one anchor per source ({len(self.sources)}), got {anchors!r}")
        drawn = self.schedule.drawn(position).tolist()
        for d, a, n in zip(self.sources, anchors, drawn, strict=True):
            d.epochs_index.adopt(a, n)

    def warm(self) -> None:
        for d, n in zip(self.sources, self.schedule.drawn(self.start).tolist(), strict=True):
            d.plan(d.epochs_index.locate(n)[0])

    def settle(self) -> None:
        for d in self.sources:
            d.settle()

    def trace_at(self, position: int) -> dict[str, Any]:
        (j,), (i,) = self._locate([position])
        record = self.sources[j].trace_at(i)
        return {"position": position, "source": j, "source_position": i, **{k: v for k, v in record.items()
                                                                               if k != "position"}}  # fmt: skip


def _phases(count: int, weights: Any) -> list[tuple[int, list[float]]]:
    """``weights`` as phases ``(start, weights)``: one phase from 0 for a plain list of weights."""
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
        raise UsageError(f"MediaMixture takes a list of weights (or phases), got {weights!r}")
    if all(isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[1], Sequence) for p in weights):
        phases = []
        for start, w in weights:
            if isinstance(start, bool) or not isinstance(start, int):
                raise UsageError(f"a phase starts at a stream position (an integer), got {start!r}")
            phases.append((start, _weights(count, w, zero_ok=True)))
        return phases
    return [(0, _weights(count, weights, zero_ok=False))]


def _weights(count: int, weights: Any, *, zero_ok: bool) -> list[float]:
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or len(weights) != count:
        raise UsageError(f"a mixture needs one weight per dataset ({count} datasets), got {weights!r}")
    return check_weights(weights, zero_ok=zero_ok)
