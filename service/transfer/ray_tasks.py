"""What runs on a Ray worker for the Ray engine: one shard's copy or re-hash, the very
:func:`~.transfer.copy_shard` / :func:`~.transfer.verify_shard` the thread engine runs, throttled and
cancelled through the :class:`~.governor.Governor` actor and reporting its bytes there.

A task returns its error (a FerryError, pickled with its class and fields) rather than raising it, so
Ray retries a task only when its worker or node died (``max_retries``), never for a shard's own fault:
that decision stays with the executor. Nothing is visible under a shard's final name before it is
whole and verified, so a worker killed mid-copy leaves at most a temp object, and the retry copies
the shard again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ferry.shard_tools.errors import FerryError, ReplicationError, StorageError
from ferry.shard_tools.storage.store import Location, not_permitted

from .governor import UNLIMITED_GRANT
from .hashed_io import PROGRESS_SECONDS
from .transfer import copy_shard, verify_shard

__all__ = ["RemoteMeter", "copy_task", "verify_task", "portable"]


class RemoteMeter:
    """A task's throttle and progress callbacks, backed by the governor: bytes pass on grants (one under
    a limit is spent to its last byte; one without limits lasts PROGRESS_SECONDS, so a new limit is heard),
    progress goes back at least every PROGRESS_SECONDS, and a governor that says cancelled sets ``cancel``
    (the copy paths then raise Cancelled)."""

    def __init__(self, governor: Any, key: str, link: str, node: str) -> None:
        self._governor = governor
        self._key, self._link, self._node = key, link, node
        self.cancel = threading.Event()
        self._budget = 0
        self._expires = 0.0
        self._pending = 0
        self._last = time.monotonic()

    def _call(self, method: Any, *args: Any) -> Any:
        import ray

        return ray.get(method.remote(self._key, *args))

    def throttle(self, n: int) -> None:
        now = time.monotonic()
        if self.cancel.is_set() or (n <= self._budget and now < self._expires):
            self._budget -= n
            return
        moved, self._pending = self._pending, 0
        granted, cancelled = self._call(self._governor.grant, self._link, self._node, n, moved)
        self._last = now
        if cancelled:
            self.cancel.set()
        self._budget = max(0, granted - n)
        self._expires = time.monotonic() + PROGRESS_SECONDS if granted >= UNLIMITED_GRANT else float("inf")

    def progress(self, n: int) -> None:
        self._pending += n
        if time.monotonic() - self._last >= PROGRESS_SECONDS:
            self.flush()

    def flush(self) -> None:
        moved, self._pending = self._pending, 0
        self._last = time.monotonic()
        if self._call(self._governor.report, moved):
            self.cancel.set()


def portable(exc: FerryError) -> FerryError:
    """``exc`` as it can travel back to the daemon: its cause (which pickling drops) decided whether a
    retry may help, so a refusal (``not_permitted``) comes back as an error that says so itself."""
    if not not_permitted(exc) or not exc.retryable:
        return exc
    if isinstance(exc, (StorageError, ReplicationError)):
        exc.retryable = False
        return exc
    return StorageError(str(exc), retryable=False)


def _node() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def copy_task(
    src: Location,
    dst: Location,
    shard: tuple[str, int, str],
    chunk_size: int,
    create_only: bool,
    link: str,
    governor: Any,
    key: str,
) -> FerryError | None:
    """Copy ``shard`` (path, size, digest) from ``src`` to ``dst`` on this worker; its error, or None."""
    path, size, digest = shard
    meter = RemoteMeter(governor, key, link, _node())
    try:
        copy_shard(src, dst, path, size, digest, chunk_size=chunk_size, throttle=meter.throttle,
                   progress=meter.progress, cancel=meter.cancel, create_only=create_only)  # fmt: skip
    except FerryError as exc:
        return portable(exc)
    finally:
        meter.flush()
    return None


def verify_task(loc: Location, shard: tuple[str, int, str], chunk_size: int) -> str | FerryError | None:
    """Re-hash ``shard`` at ``loc`` on this worker: None when it matches, the reason it does not, or its error."""
    path, size, digest = shard
    try:
        return verify_shard(loc, path, size, digest, chunk_size=chunk_size)
    except FerryError as exc:
        return portable(exc)
