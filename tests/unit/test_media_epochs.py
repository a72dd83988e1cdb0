"""Stream positions over epochs of varying length (``ferry.client.media.epochs``): pure index math."""

from __future__ import annotations

import pytest

from ferry.client.media.epochs import EpochIndex
from ferry.shard_tools.errors import StateError, UsageError

LENGTHS = [5, 3, 7, 1, 4]


def _index(calls: list[int] | None = None) -> EpochIndex:
    def length(e: int) -> int:
        if calls is not None:
            calls.append(e)
        return LENGTHS[e % len(LENGTHS)]

    return EpochIndex(length)


def test_positions_walk_the_epochs_back_to_back() -> None:
    index = _index()
    expect = [(e, i) for e in range(12) for i in range(LENGTHS[e % 5])]
    assert [index.locate(p) for p in range(len(expect))] == expect
    fresh = _index()  # positions asked out of order give the same answers
    assert [fresh.locate(p) for p in reversed(range(len(expect)))] == expect[::-1]
    assert index.first(3) == 15 and index.anchor(15) == (3, 15) and index.anchor(16) == (4, 16)
    with pytest.raises(UsageError):
        index.locate(-1)


def test_an_adopted_anchor_spares_the_epochs_before_it() -> None:
    calls: list[int] = []
    index = _index(calls)
    index.adopt([3, 15], 15)
    assert index.locate(19) == (4, 3) and calls == [3, 4]  # epochs 0-2 never planned
    assert index.locate(2) == (0, 2)


@pytest.mark.parametrize(
    "anchor, position",
    [([3, 15], 16 + 1), ([0, 1], 1), ([3, 2], 2), ((1,), 5), ([1, True], 5), ([1, -5], 0), (None, 0), ([1, 5.0], 5)],
)
def test_anchors_that_cannot_hold_the_position_are_refused(anchor: object, position: int) -> None:
    with pytest.raises(StateError):
        _index().adopt(anchor, position)


def test_an_anchor_against_the_epochs_already_planned_is_refused() -> None:
    index = _index()
    index.first(4)
    with pytest.raises(StateError):
        index.adopt([2, 9], 9)  # epoch 2 starts at 8
    index.adopt([2, 8], 9)
    empty = EpochIndex(lambda e: 0)
    with pytest.raises(UsageError, match="no sequences"):
        empty.locate(0)
