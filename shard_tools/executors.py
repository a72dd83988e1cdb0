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
import itertools
import multiprocessing
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import FerryError, StorageError, UsageError
from .orphans import exit_with_parent
from .packunit import Job, UnitResult, pack_unit
from .sources import Unit

__all__ = ["EXECUTORS", "run_units"]

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
    # exit_with_parent: workers of a killed ferry would otherwise wait on their queue forever,
    # and keep the fork server and the resource tracker alive with them.
    with cf.ProcessPoolExecutor(
        max_workers=min(workers, len(units)), mp_context=_context(), initializer=exit_with_parent
    ) as pool:
        futures = [pool.submit(pack_unit, job, u) for u in units]
        try:
            for fut in futures:  # in unit order: the output never depends on scheduling
                yield fut.result()
        except cf.process.BrokenProcessPool as exc:
            raise FerryError(
                f"a pack worker process died ({exc}); out of memory? try fewer --workers. Nothing was published"
            ) from exc
        finally:
            for fut in futures:
                fut.cancel()


def _context() -> multiprocessing.context.BaseContext:
    """A fork server where available: it imports the packer once and forks workers from that
    clean, single-threaded process (cheap start, no copies of this process' threads or handles);
    plain spawn elsewhere."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["shard_tools.orphans", "shard_tools.packunit"])
        return ctx
    return multiprocessing.get_context("spawn")


def _ray(job: Job, units: Sequence[Unit], address: str | None) -> Iterator[UnitResult]:
    try:
        import ray
    except ImportError as exc:
        raise UsageError("--executor ray needs Ray: pip install 'ferry[ray]'") from exc
    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"address": address, "logging_level": "WARNING", "log_to_driver": False}
        if address is None:
            kwargs["include_dashboard"] = False
        try:
            ray.init(**kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises assorted types for unreachable clusters
            raise UsageError(f"cannot start or reach Ray (address {address or 'local'}): {exc}") from exc
    task = ray.remote(max_retries=RAY_MAX_RETRIES, retry_exceptions=[StorageError])(pack_unit)  # type: ignore[call-overload]
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
