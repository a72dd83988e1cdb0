"""The executor's resizable semaphore (bounded concurrency, one wake-up per freed slot, idle detection) and
its workers, which keep a slot from job to job until paused, resized, stopped or out of jobs."""

from __future__ import annotations

import threading
import time

import pytest

from ferry.service.transfer.executor import Executor, Job, JobResult, ShardRef
from ferry.service.transfer.slots import Slots


class Gauge:
    """Counts who is inside a ``with`` block at once, the most ever, and how many left it."""

    def __init__(self) -> None:
        self.active = self.peak = self.done = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.active -= 1
            self.done += 1


def test_slots_bound_concurrency_and_hand_over_every_slot() -> None:
    slots = Slots(2)
    gauge = Gauge()

    def worker() -> None:
        for _ in range(25):
            assert slots.acquire()
            with gauge:
                time.sleep(0.0005)
            slots.release()

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert gauge.done == 12 * 25 and gauge.peak == 2
    assert slots.wait_idle(timeout=1.0)


def test_resize_pause_close_wake_waiters() -> None:
    slots = Slots(1)
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


def _jobs(n: int) -> list[Job]:
    return [Job("ds", "v1", ShardRef(f"shards/{i}", 1, "xxh128:" + "0" * 32), ("east",), "west") for i in range(n)]


def test_a_worker_keeps_its_slot_from_job_to_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs run on as many threads as there are slots: no hand-over (a thread wake-up) after every shard."""
    ran_on: list[str] = []

    def run_one(self: Executor, job: Job, locations: object, record: object = None) -> JobResult:
        ran_on.append(threading.current_thread().name)
        time.sleep(0.001)
        return JobResult(job, ok=True)

    monkeypatch.setattr(Executor, "run_job", run_one)
    results = Executor(transfers=2).run(_jobs(40), {})
    assert len(results) == 40 and all(r.ok for r in results)
    assert len(set(ran_on)) == 2, sorted(set(ran_on))


def test_pause_and_resize_take_effect_between_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = Executor(transfers=1)
    gauge = Gauge()
    started = threading.Event()

    def run_one(self: Executor, job: Job, locations: object, record: object = None) -> JobResult:
        started.set()
        with gauge:
            time.sleep(0.01)
        return JobResult(job, ok=True)

    monkeypatch.setattr(Executor, "run_job", run_one)
    done: list[int] = []
    runner = threading.Thread(target=lambda: done.append(len(ex.run(_jobs(30), {}))))
    runner.start()
    assert started.wait(5)
    ex.pause()
    deadline = time.monotonic() + 5
    while gauge.active and time.monotonic() < deadline:  # the job in flight ends; its worker gives the slot back
        time.sleep(0.005)
    finished = gauge.done
    time.sleep(0.05)
    assert gauge.active == 0 and gauge.done == finished  # paused: nothing new starts
    ex.set_transfers(3)
    ex.resume()
    runner.join(30)
    assert done == [30] and gauge.peak == 3  # after the resize three workers ran at once


def test_a_stopped_executor_cancels_what_nobody_started(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = Executor(transfers=1)
    started, gate = threading.Event(), threading.Event()

    def run_one(self: Executor, job: Job, locations: object, record: object = None) -> JobResult:
        started.set()
        gate.wait(5)
        return JobResult(job, ok=True)

    monkeypatch.setattr(Executor, "run_job", run_one)
    out: list[list[JobResult]] = []
    runner = threading.Thread(target=lambda: out.append(ex.run(_jobs(5), {})))
    runner.start()
    assert started.wait(5)  # one job in flight
    stopper = threading.Thread(target=ex.shutdown, args=(5.0,))
    stopper.start()
    deadline = time.monotonic() + 5
    while not ex.stopping and time.monotonic() < deadline:
        time.sleep(0.005)
    gate.set()  # the job in flight finishes after the stop
    runner.join(10)
    stopper.join(10)
    results = out[0]
    assert len(results) == 5
    assert sum(r.ok for r in results) == 1 and sum(r.cancelled for r in results) == 4
