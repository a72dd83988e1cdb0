"""Ranged reads of S3 replicas past fsspec (:mod:`ferry.shard_tools.storage.s3_ranged`), as cancellable futures.

:func:`start_direct` gives the future a race waits on (:func:`ferry.client.fetching.fetch.race`). Cancelling it (a
hedge's loser, a race that ends) shuts the read's connection down, so its thread is free at once, as cancelling
an fsspec task closes its connection. A read the direct path cannot vouch for (an error status, a cut
connection, settings it does not handle) is read again through fsspec in the same job, so every error reads as
it does there.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future, InvalidStateError
from typing import Any

from ferry.shard_tools.storage.s3_ranged import RangedGet, S3Root, plan_root
from ferry.shard_tools.storage.store import Location

__all__ = ["root_of", "start_direct"]

_roots: weakref.WeakKeyDictionary[Location, S3Root | None] = weakref.WeakKeyDictionary()
_roots_lock = threading.Lock()
# answers that say this root's objects are not GET this way (another region's endpoint, a policy botocore's
# requests meet and these do not): the location's reads go through fsspec from then on, not twice each
WRONG_WAY = frozenset({301, 307, 400, 403})


def root_of(loc: Location) -> S3Root | None:
    """How to GET ``loc``'s objects directly (planned once per location), or None: through fsspec."""
    with _roots_lock:
        if loc in _roots:
            return _roots[loc]
    try:
        root = plan_root(loc.url, getattr(loc.fs, "storage_options", {}), os.environ)
    except (OSError, ValueError):
        root = None
    with _roots_lock:
        _roots[loc] = root
    return root


def _settle(fut: Future[bytes], data: bytes | None = None, exc: BaseException | None = None) -> None:
    """Give ``fut`` its outcome unless it was cancelled meanwhile."""
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(data if data is not None else b"")
    except InvalidStateError:
        pass


def _wrong_way(loc: Location) -> None:
    with _roots_lock:
        _roots[loc] = None


def start_direct(
    loc: Location, rel: str, start: int, end: int, pool: Executor, fallback: Callable[[], Future[bytes]]
) -> Future[bytes] | None:
    """Bytes ``[start, end)`` of ``rel``, read in ``pool`` on a kept-alive connection; ``fallback()`` starts the
    same read through fsspec when the direct one gives no answer it vouches for. None: ``loc`` is not read
    this way (:func:`root_of`)."""
    root = root_of(loc)
    if root is None:
        return None
    outer: Future[bytes] = Future()  # never set running: cancel() works until the outcome is in
    read = RangedGet(root.get(rel), start, end)
    inner: list[Future[bytes]] = []

    def cancelled(fut: Future[Any]) -> None:
        if fut.cancelled():
            read.abort()
            for other in inner:
                other.cancel()

    outer.add_done_callback(cancelled)

    def job() -> None:
        if outer.cancelled():
            return
        try:
            data = read.run()
            if data is None and read.status in WRONG_WAY:
                _wrong_way(loc)
            if data is None and not outer.cancelled():
                inner.append(fallback())
                if outer.cancelled():
                    inner[0].cancel()
                    return
                data = inner[0].result()
        except BaseException as exc:  # noqa: BLE001 — the race judges every failure
            _settle(outer, exc=exc)
            return
        _settle(outer, data)

    pool.submit(job)
    return outer
