"""Shared-memory slots for workers' token windows: what a worker puts is what the training process reads, a slot is
reused only once freed, and whatever does not fit, finds no free slot or cannot share the mapping goes by the pipe."""

from __future__ import annotations

import mmap
import multiprocessing
import pickle
import time
from typing import Any

import numpy as np
import pytest

from ferry.client.slots import Slots


def _item(first: int, count: int, rows: int = 2, width: int = 5) -> list[tuple[int, Any]]:
    return [
        (k, {"windows": np.arange(rows * width, dtype=np.uint16).reshape(rows, width) + k})
        for k in range(first, first + count)
    ]


def _read(slots: Slots, item: list[tuple[int, Any]]) -> list[np.ndarray]:
    """What the training process does with an item: widen (copy) each batch, then free its slot."""
    slots.received(item)
    out = []
    for _, payload in item:
        out.append(np.array(slots.windows(payload)["windows"], dtype=np.int64))
        slots.done(payload)
    return out


def test_a_workers_windows_come_back_from_its_slot_and_the_slot_is_freed_after_the_last() -> None:
    slots = Slots(2, 2, Slots.item_bytes(3, 2 * 5 * 2))
    item = _item(0, 3)
    sent = slots.put(1, item)
    assert all("windows" not in p and p["slot"][0] in (2, 3) for _, p in sent)  # worker 1's slots
    assert len(pickle.dumps(sent)) < 400  # where they lie, not the tokens
    slots.received(sent)
    first = sent[0][1]
    np.testing.assert_array_equal(slots.windows(first)["windows"], item[0][1]["windows"])
    slots.done(first)
    assert slots._flags[sent[0][1]["slot"][0]] == 1  # two batches of the slot still to widen
    for (_, payload), (_, put) in zip(sent[1:], item[1:], strict=True):
        np.testing.assert_array_equal(slots.windows(payload)["windows"], put["windows"])
        slots.done(payload)
    assert not slots._flags.any()


def test_what_is_read_equals_what_was_put_item_after_item() -> None:
    slots = Slots(1, 2, Slots.item_bytes(4, 3 * 7 * 2))
    for first in range(0, 40, 4):
        item = _item(first, 4, rows=3, width=7)
        got = _read(slots, slots.put(0, item))
        for (_, payload), wide in zip(item, got, strict=True):
            np.testing.assert_array_equal(wide, payload["windows"])
    assert not slots._flags.any()


def test_a_worker_with_no_free_slot_sends_its_item_through_the_pipe() -> None:
    slots = Slots(2, 2, Slots.item_bytes(1, 20))
    held = [slots.put(0, _item(k, 1)) for k in range(2)]  # both of worker 0's slots taken, none read yet
    assert all("slot" in item[0][1] for item in held)
    third = _item(2, 1)
    assert slots.put(0, third) is third  # unchanged: the pipe carries it
    assert "slot" in slots.put(1, _item(3, 1))[0][1]  # worker 1's slots are its own
    _read(slots, held[0])
    assert "slot" in slots.put(0, _item(4, 1))[0][1]  # freed: taken again


def test_an_item_larger_than_a_slot_or_without_windows_is_left_as_it_is() -> None:
    slots = Slots(1, 4, Slots.item_bytes(1, 64 * 40 * 2))  # whole pages: at least the 5120 bytes asked
    assert slots.slot_bytes >= 5120 and slots.slot_bytes % mmap.PAGESIZE == 0
    fits = slots.slot_bytes // 5120
    assert "slot" in slots.put(0, _item(0, fits, rows=64, width=40))[0][1]
    big = _item(0, fits + 1, rows=64, width=40)
    assert slots.put(0, big) is big
    failure = [(0, RuntimeError("a failure travels pickled"))]
    assert slots.put(0, failure) is failure
    document = [(0, {"input_ids": np.zeros((2, 4), dtype=np.int64)})]
    assert slots.put(0, document) is document
    mixed = slots.put(0, [(0, {"windows": np.ones((2, 5), dtype=np.uint16), "boundaries": [[1], []]})])
    assert mixed[0][1]["boundaries"] == [[1], []]  # what is not windows stays in the item
    np.testing.assert_array_equal(slots.windows(mixed[0][1])["windows"], np.ones((2, 5), dtype=np.uint16))


def test_slots_pickled_for_a_worker_that_was_not_forked_use_the_pipe() -> None:
    slots = pickle.loads(pickle.dumps(Slots(2, 2, 4096)))
    assert not slots.usable
    item = _item(0, 2)
    assert slots.put(0, item) is item


def test_a_lock_held_by_a_process_that_died_holding_it_costs_a_moment_once_not_a_hang() -> None:
    slots = Slots(1, 2, Slots.item_bytes(1, 20))
    assert slots._lock.acquire()  # as if a worker died inside its few instructions under the lock
    t0 = time.monotonic()
    item = _item(0, 1)
    assert slots.put(0, item) is item
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    for k in range(100):  # no more waits: this process has stopped using the slots
        assert slots.put(0, _item(k, 1))[0][1].keys() == {"windows"}
    assert time.monotonic() - t0 < 1.0 and not slots.usable


def _child(slots: Slots, conn: Any) -> None:
    conn.send([slots.put(1, _item(10, 2, rows=3, width=9)), slots.put(1, _item(12, 1, rows=3, width=9))])
    conn.recv()  # the training process read the first item and freed its slot
    conn.send(slots.put(1, _item(13, 1, rows=3, width=9)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="slots need fork")
def test_a_forked_worker_writes_where_the_training_process_reads() -> None:
    """A real fork; and a slot freed in the training process is free for the worker."""
    slots = Slots(2, 2, Slots.item_bytes(2, 3 * 9 * 2))
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    p = ctx.Process(target=_child, args=(slots, there))
    p.start()
    first, second = here.recv()
    assert "slot" in first[0][1] and "slot" in second[0][1]  # both of worker 1's slots taken
    got = _read(slots, first)
    for (_, payload), wide in zip(_item(10, 2, rows=3, width=9), got, strict=True):
        np.testing.assert_array_equal(wide, payload["windows"])
    here.send("freed")
    third = here.recv()
    p.join(10)
    assert p.exitcode == 0
    assert third[0][1]["slot"][0] == first[0][1]["slot"][0]  # the freed one, not the pipe
    np.testing.assert_array_equal(_read(slots, third)[0], _item(13, 1, rows=3, width=9)[0][1]["windows"])
    np.testing.assert_array_equal(_read(slots, second)[0], _item(12, 1, rows=3, width=9)[0][1]["windows"])
    assert not slots._flags.any()
