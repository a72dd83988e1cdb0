"""The mixing schedule: which source each position of a mixed stream draws from.

Pure index math. Weights are turned into exact fractions ``q_j / P`` (denominator at
most ``MAX_PERIOD``). One period of ``P`` positions is laid out by earliest-deadline
scheduling with release times (the "chairman assignment" of Tijdeman): at each
position the eligible source whose next sample is most overdue goes next. After every
prefix of length ``t`` source ``j`` has been chosen ``c_j(t)`` times with
``|c_j(t) - t * q_j / P| < 1``; after a full period exactly ``q_j`` times, so the
period repeats and position ``p``'s source and its index within that source are
table lookups: O(1) per position, O(P) once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from ferry.shard_tools.errors import InvalidValueError

__all__ = ["MixSchedule", "MAX_PERIOD", "WEIGHT_LIMIT", "check_weights"]

MAX_PERIOD = 4096
#: exclusive bound of a mixing weight: weights are relative, and each becomes a float, then an exact fraction
WEIGHT_LIMIT = 2.0**63


def _show(values: Sequence[object]) -> str:
    r = repr(list(values)).replace("\n", " ")
    return r if len(r) <= 80 else r[:77] + "..."


def check_weights(weights: Sequence[object], *, zero_ok: bool = False) -> list[float]:
    """``weights`` as floats, each a real number (never a bool), finite, below :data:`WEIGHT_LIMIT` and
    positive (or, with ``zero_ok``, zero; one of them positive); else an :class:`InvalidValueError`."""
    out = []
    for w in weights:
        real = isinstance(w, (int, float, np.integer, np.floating)) and not isinstance(w, (bool, np.bool_))
        try:
            f = float(w) if real else math.nan  # type: ignore[arg-type]
        except OverflowError:  # an int beyond a float's range
            f = math.inf
        if not math.isfinite(f) or not 0 <= f < WEIGHT_LIMIT or (f == 0 and not zero_ok):
            zero = " (or zero)" if zero_ok else ""
            raise InvalidValueError(
                f"mixing weights must be finite numbers > 0{zero} and below 2**63, got {_show(weights)}"
            )
        out.append(f)
    if not any(f > 0 for f in out):
        raise InvalidValueError(f"mixing needs a positive weight, got {_show(weights)}")
    return out


class MixSchedule:
    """Position → (source, index within that source), periodic with period ``period``."""

    def __init__(self, weights: Sequence[float]) -> None:
        if not weights:
            raise InvalidValueError("mixing needs at least one source")
        weights = check_weights(weights)
        if len(weights) > MAX_PERIOD:
            raise InvalidValueError(f"a mixture has at most {MAX_PERIOD} sources, got {len(weights)}")
        total = sum(Fraction(w) for w in weights)
        fracs = [(Fraction(w) / total).limit_denominator(MAX_PERIOD) for w in weights]
        if min(fracs) == 0:
            raise InvalidValueError(_too_small(weights, fracs.index(min(fracs))))
        period = 1
        for f in fracs:
            period = period * f.denominator // math.gcd(period, f.denominator)
        if period > MAX_PERIOD:
            # denominators without a small common multiple: apportion MAX_PERIOD by largest remainder
            period = MAX_PERIOD
            exact = [f * period for f in fracs]
            quota = [int(x) for x in exact]
            by_remainder = sorted(range(len(exact)), key=lambda j: exact[j] - quota[j], reverse=True)
            for j in by_remainder[: period - sum(quota)]:
                quota[j] += 1
        else:
            quota = [int(f * period) for f in fracs]
            # the limited fractions may not sum to one exactly; settle the difference on the largest
            quota[int(np.argmax(quota))] += period - sum(quota)
        if min(quota) <= 0:
            raise InvalidValueError(_too_small(weights, quota.index(min(quota))))
        self.period = period
        self.quota = np.asarray(quota, dtype=np.int64)
        self.source, self.rank = _lay_out(quota, period)

    @classmethod
    def from_quota(cls, quota: Sequence[int]) -> MixSchedule:
        """The schedule with exactly these integer quotas and period ``sum(quota)`` (a state's record of one)."""
        if not quota or min(quota) <= 0 or sum(quota) > MAX_PERIOD:
            raise ValueError(f"quotas must be positive and sum to at most {MAX_PERIOD}, got {list(quota)}")
        self = cls.__new__(cls)
        self.period = int(sum(quota))
        self.quota = np.asarray(quota, dtype=np.int64)
        self.source, self.rank = _lay_out([int(q) for q in quota], self.period)
        return self

    @property
    def weights(self) -> list[float]:
        """The effective (rational) weights."""
        return [q / self.period for q in self.quota.tolist()]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For mixed-stream ``positions``: the source of each and its index in that source's stream."""
        pos = np.asarray(positions, dtype=np.int64)
        cycle, offset = np.divmod(pos, self.period)
        src = self.source[offset]
        return src, cycle * self.quota[src] + self.rank[offset]


def _too_small(weights: Sequence[float], j: int) -> str:
    return (
        f"mixing weight {weights[j]:g} is below 1/{MAX_PERIOD} of the weights' sum {sum(weights):g}: weights that "
        f"differ by more than about 1:{MAX_PERIOD} are not supported, got {_show(weights)}"
    )


def _lay_out(quota: list[int], period: int) -> tuple[np.ndarray, np.ndarray]:
    """One period: source and per-source rank of each position (earliest deadline first)."""
    k = len(quota)
    counts = [0] * k
    source = np.empty(period, dtype=np.int64)
    rank = np.empty(period, dtype=np.int64)
    for t in range(period):
        best = -1
        for j in range(k):
            # eligible while taking one more keeps c_j below (t+1)*q_j/P + 1; among those the earliest
            # deadline wins: the (c_j+1)-th sample of j is due at (c_j+1)*P/q_j (compared cross-multiplied)
            eligible = counts[j] * period < (t + 1) * quota[j]
            if eligible and (best < 0 or (counts[j] + 1) * quota[best] < (counts[best] + 1) * quota[j]):
                best = j
        source[t] = best
        rank[t] = counts[best]
        counts[best] += 1
    return source, rank
