"""``ferry.client.stream.ahead``: a helper thread makes items ready ahead of the consumer while it runs its step,
in order, errors in their place."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

import pytest

from ferry.client.stream.ahead import WhenIdle


def _two_then_an_error() -> Generator[int, None, None]:
    yield 1
    yield 2
    try:
        raise KeyError("inner")
    except KeyError as exc:
        raise ValueError("bad item 3") from exc


STEP_S = 0.3  # a consumer's step: far longer than WhenIdle's helper takes to notice it (at most 16 ms + delay)


def _built_in() -> Generator[str, None, None]:
    """Items that are the name of the thread that built each."""
    for _ in range(200_000):  # bounded
        yield threading.current_thread().name


def test_when_idle_builds_in_the_helper_while_the_consumer_runs_its_step() -> None:
    items = WhenIdle(_built_in(), 0.001, threading.RLock())
    got = []
    for _ in range(5):
        got.append(next(items))
        time.sleep(STEP_S)
    assert items.close(5.0)
    assert got[0] == threading.current_thread().name  # the first: nothing to build it ahead of
    assert got[1:] == ["ferry-idle"] * 4


def test_when_idle_leaves_a_consumer_that_asks_back_to_back_to_build_each_item_itself() -> None:
    items = WhenIdle(_built_in(), 0.001, threading.RLock())
    got = [next(items) for _ in range(20_000)]
    assert items.close(5.0)
    mine = sum(1 for name in got if name == threading.current_thread().name)
    assert mine >= 0.9 * len(got)  # no hand-over between threads for a loop without a step


def test_when_idle_delivers_an_error_built_ahead_in_its_place() -> None:
    idle = WhenIdle(_two_then_an_error(), 0.001, threading.RLock())
    assert next(idle) == 1
    time.sleep(STEP_S)
    assert next(idle) == 2
    time.sleep(STEP_S)  # item 3 (the error) is built ahead now
    with pytest.raises(ValueError, match="bad item 3") as info:
        next(idle)
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(StopIteration):
        next(idle)
    assert idle.close(5.0)


def test_when_idle_does_not_build_while_another_thread_holds_the_lock() -> None:
    lock = threading.RLock()
    idle = WhenIdle(_built_in(), 0.001, lock)
    next(idle)
    with lock:  # what the owner does to read the source between items (a loader's state_dict)
        time.sleep(STEP_S)
    assert next(idle) == threading.current_thread().name
    assert idle.close(5.0)


def test_when_idle_close_waits_at_most_its_timeout_for_an_item_being_built() -> None:
    release = threading.Event()

    def items() -> Generator[int, None, None]:
        yield 1
        release.wait(30)  # bounded
        yield 2

    idle = WhenIdle(items(), 0.001, threading.RLock())
    assert next(idle) == 1
    time.sleep(STEP_S)  # the helper is inside item 2 now
    t0 = time.monotonic()
    assert not idle.close(0.2)
    assert time.monotonic() - t0 < 5
    release.set()
    assert idle.close(5.0)


def test_when_idle_items_arrive_in_order_and_the_end_stays_the_end() -> None:
    idle = WhenIdle((i for i in range(50)), 0.001, threading.RLock())
    got = []
    for item in idle:
        got.append(item)
        if item % 10 == 0:
            time.sleep(0.02)  # a step now and then: some items are built by the helper
    assert got == list(range(50))
    with pytest.raises(StopIteration):
        next(idle)
    assert idle.close(1.0)


def test_when_idle_close_closes_the_items() -> None:
    closed: list[bool] = []

    def items() -> Generator[int, None, None]:
        try:
            yield from range(10**6)
        finally:
            closed.append(True)

    idle = WhenIdle(items(), 0.001, threading.RLock())
    next(idle)
    assert idle.close(2.0)
    assert closed == [True]
    with pytest.raises(StopIteration):
        next(idle)
