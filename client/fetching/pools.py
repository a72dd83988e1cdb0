"""Background threads that never hold up the end of their process.

A ``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, after every
job still queued has run. A training process that ends early (Ctrl-C, ``sys.exit`` from its own SIGTERM
handler, a ``break`` out of the loop) or a DataLoader worker told to stop would first download every shard
its prefetch had queued, and wait for ever on a fetch that hangs. :class:`DaemonPool` runs the same jobs on
daemon threads: at exit its queued jobs are dropped, and its running ones have ``EXIT_WAIT_S`` seconds (all
pools together) to end, so that a fetch about to fail or finish cleans up after itself; one still running then
is abandoned with the process (a half-written cache file keeps its temp name; a later eviction removes it).
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from ferry.shard_tools.threadname import name_os_thread

__all__ = ["EXIT_WAIT_S", "DaemonPool", "PriorityPool"]

EXIT_WAIT_S = 1.0

P = ParamSpec("P")
T = TypeVar("T")
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]
_STOP = None  # one per thread, queued behind the jobs by shutdown() or when the pool is dropped


class DaemonPool(Executor):
    """At most ``max_workers`` daemon threads named ``<prefix>_<n>`` (also for the OS), started as jobs come."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max, self._prefix = max_workers, thread_name_prefix
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._state = _State()
        self._closed = False
        self._pid = os.getpid()
        _LIVE.add(self)
        # a pool dropped without shutdown() stops its idle threads (they hold no reference to it)
        weakref.finalize(self, _stop_all, self._jobs, self._threads)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        state = self._state
        with state.lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put((future, fn, args, kwargs))
            state.queued += 1
            if state.queued > state.idle and len(self._threads) < self._max:
                name = f"{self._prefix}_{len(self._threads)}"
                thread = threading.Thread(target=_work, args=(self._jobs, state), name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Start no more jobs; ``cancel_futures``: drop the queued ones; ``wait``: until the running ones end."""
        with self._state.lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is not None:
                        job[0].cancel()
                        self._state.queued -= 1
        _stop_all(self._jobs, self._threads)
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()


_LIVE: weakref.WeakSet[DaemonPool] = weakref.WeakSet()


class PriorityPool:
    """Jobs on the threads of a :class:`DaemonPool`, the one of lowest ``priority`` first whenever a thread is free
    (ties in the order submitted). Each job queues a turn on the pool; a turn runs the best job waiting when it
    starts, so a job submitted later with a lower priority overtakes the queued ones."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._pool = DaemonPool(max_workers, thread_name_prefix)
        self._heap: list[tuple[Any, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._order = itertools.count()

    def submit(self, priority: Any, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            heapq.heappush(self._heap, (priority, next(self._order), future, fn, args))
        self._pool.submit(self._turn)  # RuntimeError after shutdown, as a DaemonPool's
        return future

    def _turn(self) -> None:
        """Run the best job waiting (one cancelled meanwhile is skipped)."""
        while True:
            with self._lock:
                if not self._heap:
                    return
                _, _, future, fn, args = heapq.heappop(self._heap)
            if future.set_running_or_notify_cancel():
                break
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 — the caller sees it through the future
            future.set_exception(exc)
        else:
            future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As :meth:`DaemonPool.shutdown`; ``cancel_futures`` cancels the jobs waiting for a turn too."""
        self._pool.shutdown(wait=False, cancel_futures=cancel_futures)
        if cancel_futures:
            with self._lock:
                waiting, self._heap = self._heap, []
            for job in waiting:
                job[2].cancel()
        if wait:
            self._pool.shutdown(wait=True)


@atexit.register
def _at_exit() -> None:
    """Drop the queued jobs of this process's pools and give the running ones ``EXIT_WAIT_S`` to end. Runs at
    interpreter exit, after non-daemon threads were joined (never in a forked worker, which ends with
    ``os._exit``); pools copied from a parent by a fork are not this process's (their threads are not here)."""
    deadline = time.monotonic() + EXIT_WAIT_S
    pools = [pool for pool in list(_LIVE) if pool._pid == os.getpid()]
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    for pool in pools:
        for thread in pool._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class _State:
    """Counts shared by a pool and its threads (no reference to the pool itself)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued = 0  # jobs no thread has taken yet
        self.idle = 0  # threads waiting for a job


def _stop_all(jobs: queue.SimpleQueue[_Job | None], threads: list[threading.Thread]) -> None:
    for _ in threads:
        jobs.put(_STOP)


def _work(jobs: queue.SimpleQueue[_Job | None], state: _State) -> None:
    name_os_thread()
    while True:
        with state.lock:
            state.idle += 1
        job = jobs.get()
        with state.lock:
            state.idle -= 1
            if job is not None:
                state.queued -= 1
        if job is None:
            return
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 — the caller sees it through the future
            future.set_exception(exc)
        else:
            future.set_result(result)
        del job, future, fn, args, kwargs
