"""Joining a Ray cluster, for pack's Ray executor and the daemon's Ray engine: ``ray.init`` with its
failures made whole (undone, and raised as a UsageError) and Ray Client's lost session servers asked
for again.

Ray Client's proxy forks a server for each new session from a process busy with gRPC threads, and that
child sometimes dies at once (ray-project/ray#63202). The next session usually starts, so
:func:`init_ray` asks for another, a bounded number of times, and logs each.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from .errors import UsageError

__all__ = ["import_ray", "init_ray", "session_server_died", "SESSION_TRIES"]

#: Ray Client sessions asked for, in all, while the proxy loses the server it starts for each
SESSION_TRIES = 4
#: seconds between those
_SESSION_PAUSE = 1.0
#: what Ray Client's proxy answers when the server it starts for a session dies: at once, before the proxy reads
#: its command line (the proxy's psutil finds a zombie), or before it answers
_SERVER_DIED = ("Starting Ray client server failed", "psutil.ZombieProcess", "Proxy failed to Connect to backend")

log = logging.getLogger("ferry.ray")


def import_ray(setting: str) -> Any:
    """The ``ray`` module, or a UsageError that says how to install it (``setting``: what asked for Ray)."""
    try:
        import ray
    except ImportError as exc:
        raise UsageError(f"{setting} needs Ray, an optional extra: pip install 'ferry-data[ray]'") from exc
    return ray


def session_server_died(address: str | None, exc: BaseException) -> bool:
    """Whether ``ray.init(address)`` failed because Ray Client's proxy lost the server it had just
    started for this session (worth asking again); any other failure is not."""
    return (address or "").startswith("ray://") and any(words in str(exc) for words in _SERVER_DIED)


def _forget_failed_init(ray: Any) -> None:
    """Undo what a failed ``ray.init`` left behind: after a Ray Client connection fails, every later
    ``ray.init`` of this process fails too (an assertion inside Ray) until ``ray.shutdown``."""
    with contextlib.suppress(Exception):
        ray.shutdown()


def init_ray(ray: Any, address: str | None, failure: str, **kwargs: Any) -> None:
    """``ray.init(address=address, **kwargs)``; when it fails, a UsageError ``"<failure>: <Ray's
    error>"`` with the failed start undone. A Ray Client session whose server died as it started is
    asked for again, up to :data:`SESSION_TRIES` sessions in all."""
    for attempt in range(1, SESSION_TRIES + 1):
        try:
            ray.init(address=address, **kwargs)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises assorted types for unreachable clusters
            _forget_failed_init(ray)
            if attempt == SESSION_TRIES or not session_server_died(address, exc):
                tried = f" ({attempt} sessions asked for)" if attempt > 1 else ""
                raise UsageError(f"{failure}{tried}: {exc}") from exc
            log.warning(
                "the Ray Client server for this session died as it started (ray-project/ray#63202); "
                "asking %s for another session (%d of %d)",
                address,
                attempt + 1,
                SESSION_TRIES,
            )
        time.sleep(_SESSION_PAUSE)
