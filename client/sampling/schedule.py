"""Mixture schedules: which source each position of a mixed stream draws from, phase by phase.

Pure index math. A schedule is a list of phases ``(start, quota)``: from global sample
``start`` on (until the next phase's start) source ``j`` gets ``quota[j]`` of every
``sum(quota)`` positions, laid out by :class:`~ferry.client.sampling.mixing.MixSchedule` on positions
counted from the phase's start. So within a phase every prefix holds each source in its
proportion ±1 sample, and at a boundary each source continues exactly where it stopped:
position ``p`` of phase ``k`` is sample ``base[k][j] + r`` of its source ``j``, where
``base[k][j]`` counts the samples of ``j`` drawn by the phases before ``k`` (set up once,
O(phases)) and ``r`` is the index within the phase (O(1)). A quota of 0 leaves a source
out of a phase: sources not yet added, or removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .mixing import MAX_PERIOD, MixSchedule

__all__ = ["Schedule", "MAX_PHASES", "MAX_START", "quota_of"]

MAX_PHASES = 4096
MAX_START = 2**62  # exclusive bound of a phase's start: a stream position (as ferry.client.resume.state.MAX_POSITION)
Phases = Sequence[tuple[int, Sequence[int]]]


def quota_of(weights: Sequence[float]) -> tuple[int, ...]:
    """Exact integer quotas for one phase's weights (0 = left out; the others as :class:`MixSchedule` makes them)."""
    return _quota(tuple(float(w) for w in weights))


@lru_cache(maxsize=1024)
def _quota(weights: tuple[float, ...]) -> tuple[int, ...]:
    """:func:`quota_of`, once per weight vector (schedules repeat a few vectors over many phases)."""
    active = [j for j, w in enumerate(weights) if w > 0]
    if not active:
        raise ValueError(f"a phase needs at least one positive weight, got {list(weights)}")
    quota = [0] * len(weights)
    for j, q in zip(active, MixSchedule([weights[j] for j in active]).quota.tolist(), strict=True):
        quota[j] = q
    return tuple(quota)


@lru_cache(maxsize=256)
def _layout(quota: tuple[int, ...]) -> tuple[MixSchedule, np.ndarray]:
    """The periodic layout of one phase over its active sources, and their source numbers."""
    active = np.asarray([j for j, q in enumerate(quota) if q > 0], dtype=np.int64)
    return MixSchedule.from_quota([quota[j] for j in active.tolist()]), active


class Schedule:
    """Phases ``(start, quota)``, starts strictly increasing from 0; position → (source, index in that source)."""

    def __init__(self, phases: Phases) -> None:
        _check(phases)
        self.phases: list[tuple[int, tuple[int, ...]]] = [(int(s), tuple(int(q) for q in qs)) for s, qs in phases]
        self.sources = len(self.phases[0][1])
        self.starts = np.asarray([s for s, _ in self.phases], dtype=np.int64)
        self._layouts = [_layout(q) for _, q in self.phases]
        base = np.zeros((len(self.phases), self.sources), dtype=np.int64)
        for k in range(len(self.phases) - 1):
            base[k + 1] = base[k] + self._drawn_in(k, int(self.starts[k + 1] - self.starts[k]))
        self.base = base

    @classmethod
    def from_weights(cls, phases: Sequence[tuple[int, Sequence[float]]]) -> Schedule:
        """A schedule from weights per phase (0 leaves a source out of that phase)."""
        return cls([(s, quota_of(w)) for s, w in phases])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.phases == other.phases

    def __hash__(self) -> int:
        return hash(tuple(self.phases))

    @property
    def quota(self) -> np.ndarray:
        """The first phase's quotas (a single-phase schedule's, as :class:`MixSchedule` has them)."""
        return np.asarray(self.phases[0][1], dtype=np.int64)

    @property
    def weights(self) -> list[float]:
        """The first phase's effective (rational) weights."""
        q = self.phases[0][1]
        return [x / sum(q) for x in q]

    def phase_of(self, position: int) -> int:
        return int(np.searchsorted(self.starts, position, side="right")) - 1

    def _drawn_in(self, k: int, length: int) -> np.ndarray:
        """Samples of each source drawn by the first ``length`` positions of phase ``k``."""
        mix, active = self._layouts[k]
        cycles, rest = divmod(length, mix.period)
        out = np.zeros(self.sources, dtype=np.int64)
        out[active] = cycles * mix.quota + np.bincount(mix.source[:rest], minlength=len(active))
        return out

    def drawn(self, position: int) -> np.ndarray:
        """Samples of each source drawn by positions ``[0, position)``: where each source's stream stands."""
        if position < 0:
            raise ValueError(f"stream positions are non-negative, got {position}")
        k = self.phase_of(position)
        return self.base[k] + self._drawn_in(k, position - int(self.starts[k]))

    def _local(self, k: int, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mix, active = self._layouts[k]
        a, r = mix.locate(local)
        src = active[a]
        return src, self.base[k][src] + r

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For stream ``positions``: the source of each and its index in that source's stream."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and int(pos.min()) < 0:
            raise ValueError("stream positions are non-negative")
        if len(self.phases) == 1 or pos.size == 0:
            return self._local(0, pos)
        ph = np.searchsorted(self.starts, pos, side="right") - 1
        lo, hi = int(ph.min()), int(ph.max())
        if lo == hi:  # the usual case: a whole batch inside one phase
            return self._local(lo, pos - self.starts[lo])
        src, idx = np.empty_like(pos), np.empty_like(pos)
        for k in range(lo, hi + 1):
            sel = ph == k
            src[sel], idx[sel] = self._local(k, pos[sel] - self.starts[k])
        return src, idx


def _check(phases: Phases) -> None:
    """ValueError unless: 1..MAX_PHASES phases, starts strictly increasing from 0 and below MAX_START, equal
    widths, exact quotas."""
    if not isinstance(phases, Sequence) or not 0 < len(phases) <= MAX_PHASES:
        raise ValueError(f"a schedule has 1 to {MAX_PHASES} phases")
    width = None
    last = -1
    for start, quota in phases:
        if not _is_int(start) or start <= last or (last < 0 and start != 0):
            raise ValueError(f"phase starts must be integers increasing from 0, got {start!r} after {last}")
        if start >= MAX_START:
            raise ValueError(f"a phase starts at a stream position below 2**62, got {start!r}")
        last = start
        if width is None:
            width = len(quota)
        if len(quota) != width or not all(_is_int(q) and q >= 0 for q in quota):
            raise ValueError(f"every phase needs {width} non-negative integer quotas, got {list(quota)!r}")
        if not 0 < sum(quota) <= MAX_PERIOD:
            raise ValueError(f"a phase's quotas must sum to 1..{MAX_PERIOD}, got {list(quota)!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
