"""``ferry.client.stream.ahead``: a thread makes items ready ahead of the consumer (``Ahead``: always; ``WhenIdle``:
while the consumer runs its step), in order, errors in their place."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

import pytest

from ferry.client.stream.ahead import Ahead, WhenIdle


def _two_then_an_error() -> Generator[int, None, None]:
    yield 1
    yield 2
    try:
        raise KeyError("inner")
    except KeyError as exc:
        raise ValueError("bad item 3") from exc


def test_items_arrive_in_order_and_the_end_stays_the_end() -> None:
    ahead = Ahead((i for i in range(50)), depth=3)
    assert list(ahead) == list(range(50))
    with pytest.raises(StopIteration):
        next(ahead)
    assert ahead.close(1.0)


def test_an_error_arrives_after_the_items_before_it_as_it_was_raised() -> None:
    ahead = Ahead(_two_then_an_error(), depth=2)
    assert next(ahead) == 1
    assert next(ahead) == 2
    with pytest.raises(ValueError, match="bad item 3") as info:
        next(ahead)
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(StopIteration):  # after an error the iteration is over
        next(ahead)


def test_the_thread_stays_at_most_depth_items_ahead() -> None:
    made: list[int] = []

    def items() -> Generator[int, None, None]:
        for i in range(100):
            made.append(i)
            yield i

    ahead = Ahead(items(), depth=2)
    for taken in range(5):
        assert next(ahead) == taken
        time.sleep(0.05)  # room for the thread to run as far ahead as it may
        # taken + 1 delivered; at most 2 waiting in the queue and 1 held while the queue is full
        assert len(made) <= taken + 1 + 2 + 1, (taken, len(made))
    assert ahead.close(1.0)


def test_close_ends_the_thread_and_closes_the_items_in_it() -> None:
    closed: list[str] = []

    def items() -> Generator[int, None, None]:
        try:
            yield from range(10**6)
        finally:
            closed.append(threading.current_thread().name)

    ahead = Ahead(items(), depth=2, name="test-ahead")
    next(ahead)
    assert ahead.close(2.0)
    assert closed == ["test-ahead"]  # closed by the thread that ran it, not the consumer
    with pytest.raises(StopIteration):
        next(ahead)


def test_close_waits_at_most_its_timeout_for_an_item_in_progress() -> None:
    release = threading.Event()

    def items() -> Generator[int, None, None]:
        yield 0
        release.wait(10)  # an item that takes long (a worker still fetching)
        yield 1

    ahead = Ahead(items(), depth=1)
    assert next(ahead) == 0
    time.sleep(0.05)
    t = time.monotonic()
    assert not ahead.close(0.2)  # still inside next(items)
    assert 0.15 < time.monotonic() - t < 2.0
    release.set()
    assert ahead.close(2.0)  # it then sees the stop and ends without handing item 1 over


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
