"""Executors: run :func:`~.packunit.pack_unit` over units, yielding results in unit order.

``local`` runs in-process (``workers=1``) or in a process pool whose workers end with the
process that started them (:mod:`.orphans`); ``ray`` fans
units out as Ray tasks (retried on worker loss and storage errors) that write their shards
straight to the output URL. Results always come back in unit order, so the output never
depends on the executor or on scheduling.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import itertools
import multiprocessing
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from ..errors import FerryError, StorageError, UsageError
from ..orphans import exit_with_parent
from ..ray_session import import_ray, init_ray
from ..sources import Unit
from .packunit import Job, UnitResult, pack_unit

__all__ = ["EXECUTORS", "run_units", "worker_context"]

EXECUTORS = ("local", "ray")
RAY_MAX_RETRIES = 3


def run_units(
    job: Job, units: Sequence[Unit], executor: str = "local", *, workers: int = 1, ray_address: str | None = None
) -> Iterator[UnitResult]:
    """Pack every unit with the chosen executor; yields one result per unit, in order."""
    if executor == "ray":
        return _ray(job, units, ray_address)
    if executor != "local":
        raise UsageError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if workers == 1 or len(units) <= 1:
        return (pack_unit(job, u) for u in units)
    return _pool(job, units, workers)


def _pool(job: Job, units: Sequence[Unit], workers: int) -> Iterator[UnitResult]:
    pool: cf.ProcessPoolExecutor | None = None
    try:
        with _sigint_held():  # a Ctrl-C meanwhile is handled when this ends, inside the ``try``
            pool = cf.ProcessPoolExecutor(
                max_workers=min(workers, len(units)), mp_context=worker_context(), initializer=_init_worker
            )
            futures = [pool.submit(_pack_unit_in_worker, job, u) for u in units]
        for fut in futures:  # in unit order: the output never depends on scheduling
            yield fut.result()
    except cf.process.BrokenProcessPool as exc:
        raise FerryError(
            f"a pack worker process died ({exc}); out of memory? try fewer --workers. Nothing was published"
        ) from exc
    finally:
        # Cancelled by the pool's own manager thread: a future cancelled from here while a
        # worker dies (Ctrl-C) makes Python < 3.12 print an InvalidStateError traceback.
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """A Ctrl-C during the ``with`` is handled when it ends: the pool starts a worker in ``submit`` and registers
    it only after the fork, so an interrupt between the two would leave a worker the pool never stops, and ferry
    would wait for it forever on its way out. (Blocking the signal is not enough: another thread can take it,
    and Python still raises it in the main thread.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if got and callable(previous):
            previous(signal.SIGINT, None)  # Python's default raises KeyboardInterrupt here
        elif got and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


_packing = False  # in a pool worker: whether it is inside a unit, where Ctrl-C may interrupt it


def _init_worker() -> None:
    """Pool initializer. A worker of a killed ferry would wait on its queue forever, keeping the
    fork server and the resource tracker alive too: it ends with ferry instead. Ctrl-C (SIGINT
    to the whole process group) interrupts a unit being packed, so ferry stops promptly, but not
    an idle worker: one dying in its queue wait prints a traceback and breaks the pool."""
    exit_with_parent()
    signal.signal(signal.SIGINT, _on_sigint)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _packing:
        raise KeyboardInterrupt


def _pack_unit_in_worker(job: Job, unit: Unit) -> UnitResult:
    global _packing
    _packing = True
    try:
        return pack_unit(job, unit)
    finally:
        _packing = False


def worker_context() -> multiprocessing.context.BaseContext:
    """A fork server where available: it imports the packer once and forks workers from that
    clean, single-threaded process (cheap start, no copies of this process' threads or handles);
    plain spawn elsewhere."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["ferry.shard_tools.packer.forkserver_preload"])
        return ctx
    return multiprocessing.get_context("spawn")


def _ray(job: Job, units: Sequence[Unit], address: str | None) -> Iterator[UnitResult]:
    ray = import_ray("--executor ray")
    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
        if address is None:
            kwargs["include_dashboard"] = False
        init_ray(ray, address, f"cannot start or reach Ray (address {address or 'local'})", **kwargs)
    task = ray.remote(max_retries=RAY_MAX_RETRIES, retry_exceptions=[StorageError])(pack_unit)
    # A bounded window of tasks in flight, results taken in unit order. After an error nothing
    # more is submitted and the few tasks in flight are left to finish (their shards are
    # content-addressed, so harmless): ray.cancel racing a finishing task can crash the driver
    # in Ray 2.60 ("Tried to complete task that was not pending").
    window = max(4, 2 * int(ray.cluster_resources().get("CPU", 1)))
    pending: collections.deque[Any] = collections.deque()
    try:
        queued = iter(units)
        for unit in itertools.islice(queued, window):
            pending.append(task.remote(job, unit))
        while pending:
            ref = pending.popleft()
            try:
                result = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, FerryError):
                    raise cause from None
                raise
            for unit in itertools.islice(queued, 1):
                pending.append(task.remote(job, unit))
            yield result
    finally:
        if started_here:
            ray.shutdown()
