"""Global stream positions over epochs of varying length: pure index math (no data read).

A media dataset's epoch ``e`` holds ``length(e)`` packed sequences (its plan's, which depends on the epoch's
shuffle). The stream is every epoch's sequences back to back: epoch ``e`` covers the positions
``[first(e), first(e) + length(e))``, ``first(0) = 0``. A position is the same sequence for any number of ranks
or workers; a loader state holds one, with an *anchor* ``(e, first(e))`` for its epoch, so that a resumed run
finds the position's epoch without planning every epoch before it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from ferry.shard_tools.errors import StateError, UsageError

__all__ = ["EpochIndex"]


class EpochIndex:
    """``position ↔ (epoch, index in the epoch)`` for epochs of ``length(e)`` positions each (``length`` is called
    once per epoch this index walks over; an epoch of no positions is a ``UsageError``)."""

    def __init__(self, length: Callable[[int], int]) -> None:
        self._length = length
        self._epochs: list[int] = [0]  # epochs whose first position is known, ascending
        self._firsts: list[int] = [0]  # their first positions
        self._lengths: dict[int, int] = {}

    def length(self, epoch: int) -> int:
        got = self._lengths.get(epoch)
        if got is None:
            got = int(self._length(epoch))
            if got <= 0:
                raise UsageError(f"epoch {epoch} of the dataset has no sequences to read")
            self._lengths[epoch] = got
        return got

    def _learn(self, epoch: int, first: int) -> None:
        i = bisect.bisect_left(self._epochs, epoch)
        if i < len(self._epochs) and self._epochs[i] == epoch:
            return
        self._epochs.insert(i, epoch)
        self._firsts.insert(i, first)

    def first(self, epoch: int) -> int:
        """The position of epoch ``epoch``'s first sequence (walks on from the nearest known epoch before it)."""
        if epoch < 0:
            raise UsageError(f"epochs count from 0, got {epoch}")
        i = bisect.bisect_right(self._epochs, epoch) - 1
        e, f = self._epochs[i], self._firsts[i]
        while e < epoch:
            f += self.length(e)
            e += 1
            self._learn(e, f)
        return f

    def locate(self, position: int) -> tuple[int, int]:
        """``(epoch, index)`` of stream position ``position``."""
        if position < 0:
            raise UsageError(f"stream positions are non-negative, got {position}")
        i = bisect.bisect_right(self._firsts, position) - 1
        e, f = self._epochs[i], self._firsts[i]
        while position >= f + self.length(e):
            f += self.length(e)
            e += 1
            self._learn(e, f)
        return e, position - f

    def anchor(self, position: int) -> tuple[int, int]:
        """``(epoch, first position of that epoch)`` of ``position``: what a state records beside it."""
        e, index = self.locate(position)
        return e, position - index

    def adopt(self, anchor: object, position: int) -> None:
        """Take a state's anchor of ``position`` as known, after checking it holds ``position`` (a
        :class:`StateError` if it is malformed or does not)."""
        pair = list(anchor) if isinstance(anchor, (list, tuple)) else []
        if len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair):
            raise StateError(f"a media loader state's anchor must be [epoch, first position], got {anchor!r}")
        epoch, first = int(pair[0]), int(pair[1])
        if not first <= position < first + self.length(epoch):
            raise StateError(f"the state's epoch {epoch} from position {first} does not hold position {position}")
        if epoch == 0 and first != 0:
            raise StateError(f"epoch 0 starts at position 0, the state says {first}")
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if self._epochs[i] == epoch:
            if self._firsts[i] != first:
                raise StateError(f"the state puts epoch {epoch} at position {first}, the plans at {self._firsts[i]}")
            return
        after = self._firsts[i + 1] if i + 1 < len(self._firsts) else None
        if first - self._firsts[i] < epoch - self._epochs[i] or (after is not None and after <= first):
            raise StateError(f"the state's epoch {epoch} from position {first} contradicts the epochs planned")
        self._learn(epoch, first)
