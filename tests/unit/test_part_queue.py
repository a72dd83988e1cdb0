"""The parts of a whole-shard fill: a read that ends asks the next part at once (not only when the fill's thread
takes the head), within the bounds of reads in flight and parts held."""

from __future__ import annotations

import logging
from concurrent.futures import Future

import pytest

from ferry.client.fetching.parts import Entry, PartQueue


class _Asks:
    """``ask(k)``: one read per part, left pending for the test to end; ``done_at_once``: parts whose read has
    already ended when it is returned."""

    def __init__(self, done_at_once: frozenset[int] = frozenset()) -> None:
        self.reads: dict[int, Future[tuple[int, bytes]]] = {}
        self.done_at_once = done_at_once

    def __call__(self, k: int) -> list[Entry]:
        fut: Future[tuple[int, bytes]] = Future()
        if k in self.done_at_once:
            fut.set_result((0, bytes([k])))
        self.reads[k] = fut
        return [(k, k + 1, fut, [])]

    def end(self, k: int) -> None:
        self.reads[k].set_result((0, bytes([k])))

    def drain(self, parts: PartQueue) -> list[int]:
        """Take every part left, ending each read still running as it is taken: the parts' order."""
        got = []
        while (entry := parts.take()) is not None:
            if not entry[2].done():  # type: ignore[union-attr]
                self.end(entry[0])
            got.append(entry[0])
        return got


def test_a_read_done_before_the_head_asks_the_next_part_at_once() -> None:
    asks = _Asks()
    parts = PartQueue(10, 2, asks)
    head = parts.take()
    assert head is not None and head[0] == 0
    assert sorted(asks.reads) == [0, 1]  # two connections: the head's read (taken, still running) and part 1's
    asks.end(1)  # a later part ends while the head is still on its way: its connection goes to part 2 at once
    assert sorted(asks.reads) == [0, 1, 2]
    asks.end(2)
    asks.end(3)
    asks.end(4)
    # four parts held and not taken (1-4): the bound, however many reads have ended
    assert sorted(asks.reads) == [0, 1, 2, 3, 4]
    asks.end(0)
    assert [head[0], *asks.drain(parts)] == list(range(10))


def test_reads_in_flight_stay_within_the_window() -> None:
    asks = _Asks()
    parts = PartQueue(100, 3, asks)
    assert parts.take() is not None
    assert sorted(asks.reads) == [0, 1, 2]  # 0 (taken, still running), 1 and 2: three connections
    asks.end(1)
    assert sorted(asks.reads) == [0, 1, 2, 3]  # one ended, one more in flight


def test_a_read_already_done_when_asked_keeps_the_order() -> None:
    """A read that ended before it was queued calls back from inside the top-up: the parts stay in order."""
    asks = _Asks(done_at_once=frozenset(range(0, 20, 2)))
    parts = PartQueue(20, 2, asks)
    assert asks.drain(parts) == list(range(20))


def test_stop_cancels_the_reads_not_taken_and_asks_no_more() -> None:
    asks = _Asks()
    parts = PartQueue(10, 2, asks)
    assert parts.take() is not None
    asked = sorted(asks.reads)
    parts.stop()
    assert all(asks.reads[k].cancelled() for k in asked if k != 0)
    asks.end(0)  # the taken read ends after the stop: nothing more is asked
    assert sorted(asks.reads) == asked
    assert parts.take() is None


def test_local_pieces_take_no_connection() -> None:
    """Bytes already on the node (no read) are queued in order and do not count against the window."""

    def ask(k: int) -> list[Entry]:
        fut: Future[tuple[int, bytes]] = Future()
        fut.set_result((0, b"x"))
        return [(k, k + 1, None, []), (k + 1, k + 2, fut, [])]

    parts = PartQueue(5, 1, ask)
    got = []
    while (entry := parts.take()) is not None:
        got.append((entry[0], entry[2] is None))
    assert got == [(k + d, d == 0) for k in range(5) for d in (0, 1)]


def test_a_part_that_cannot_be_asked_from_a_callback_fails_in_the_fills_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At exit the pool refuses new reads: a read that ends then cannot ask the next part. Nothing is raised or
    logged in the thread that ran the read; the fill's thread asks the part again and meets the error."""
    asks = _Asks()

    def ask(k: int) -> list[Entry]:
        if k >= 2:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return asks(k)

    parts = PartQueue(5, 2, ask)
    assert parts.take() is not None
    with caplog.at_level(logging.DEBUG, logger="concurrent.futures"):
        asks.end(1)  # its callback tries part 2
    assert not caplog.records
    with pytest.raises(RuntimeError, match="after shutdown"):
        parts.take()
        parts.take()


def test_bytes_already_on_the_node_do_not_count_within_the_parts_held() -> None:
    """A part cut into pieces around frames that arrived before (read from the disk when taken) holds one read's
    bytes: the parts asked ahead are bounded by reads, so such a fill keeps as many reads going as any other."""
    reads: list[int] = []

    def ask(k: int) -> list[Entry]:
        fut: Future[tuple[int, bytes]] = Future()
        fut.set_result((0, b"x"))  # ended at once: only the bound on parts held stops the asking
        reads.append(k)
        a = 10 * k
        return [(a, a + 3, None, []), (a + 3, a + 7, fut, []), (a + 7, a + 10, None, [])]

    parts = PartQueue(10, 2, ask)
    assert parts.take() is not None
    # four reads held (twice the window), in twelve entries less the one taken; a bound on entries asks two parts
    assert reads == [0, 1, 2, 3]
    order = []
    while (entry := parts.take()) is not None:
        order.append(entry[0])
    assert order == [a for k in range(10) for a in (10 * k, 10 * k + 3, 10 * k + 7)][1:]
