"""The executor's resizable semaphore: bounded concurrency, one wake-up per freed slot, idle detection."""

from __future__ import annotations

import threading
import time

from service.executor import _Slots


def test_slots_bound_concurrency_and_hand_over_every_slot() -> None:
    slots = _Slots(2)
    active = 0
    peak = 0
    done = 0
    lock = threading.Lock()

    def worker() -> None:
        nonlocal active, peak, done
        for _ in range(25):
            assert slots.acquire()
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.0005)
            with lock:
                active -= 1
                done += 1
            slots.release()

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert done == 12 * 25 and peak == 2
    assert slots.wait_idle(timeout=1.0)


def test_resize_pause_close_wake_waiters() -> None:
    slots = _Slots(1)
    assert slots.acquire()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire()))
    waiter.start()
    time.sleep(0.05)
    assert got == []  # full: waits
    slots.resize(2)  # a second slot opens: the waiter proceeds
    waiter.join(timeout=5)
    assert got == [True]
    slots.set_paused(True)
    slots.release()
    late: list[bool] = []
    blocked = threading.Thread(target=lambda: late.append(slots.acquire()))
    blocked.start()
    time.sleep(0.05)
    assert late == []  # paused: nothing starts even with a free slot
    assert not slots.wait_idle(timeout=0.05)  # one slot is still held
    slots.release()
    assert slots.wait_idle(timeout=1.0)
    slots.close()  # closing wakes the paused waiter, which gives up
    blocked.join(timeout=5)
    assert late == [False]
