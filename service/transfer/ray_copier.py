"""The Ray engine's daemon side: each copy a Ray task spread over the cluster's nodes, the limits and
the cancel flag in one :class:`~.governor.Governor` actor, progress read back from it.

The daemon stays the one control plane: it plans, holds the lease, records every attempt and
publishes; only the bytes move on other nodes. A worker or node that dies mid-copy costs a retry of
that task elsewhere (Ray's ``max_retries``); the shard only ever appears under its final name whole
and verified (the task runs the very ``copy_shard`` of the thread engine). Ray is an optional
extra, imported only when this engine is chosen.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import uuid
from typing import Any

from ferry.shard_tools.errors import Cancelled, FerryError, StorageError, UsageError
from ferry.shard_tools.ray_session import import_ray, init_ray
from ferry.shard_tools.storage.store import Location

from .bandwidth import Bandwidth
from .governor import Governor, Rates
from .hashed_io import CHUNK_SIZE, PROGRESS_SECONDS, Progress
from .node_spread import NodeSpread
from .ray_tasks import copy_task, verify_task

__all__ = ["RayCopier", "CONFIG_SETTINGS", "SYNC_SETTINGS"]

#: seconds to wait for the Ray cluster's address to accept a connection
_CONNECT_TIMEOUT = 10.0
#: seconds a copy still waits for its task once the executor is cancelled (the task stops at its next grant)
_CANCEL_GRACE = 10.0


#: how errors name the settings that chose the Ray engine and its address: ``ferry serve``'s config keys
CONFIG_SETTINGS = ('[transfer] engine = "ray"', "[transfer] address")
#: ``ferry sync``'s flags
SYNC_SETTINGS = ("--engine ray", "--ray-address")


def _stop_handlers() -> dict[int, Any]:
    """This process' SIGTERM and SIGINT handlers (main thread only: no other can change them)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


def _restore(kept: dict[int, Any]) -> None:
    """Put back what :func:`_stop_handlers` saw: ``ray.init`` in a driver's main thread replaces SIGTERM's
    handler by one that exits at once (and its core worker's crash handler dumps a stack first), which
    took the daemon's graceful stop away (exit 15 or an abort instead of a drain)."""
    for s, handler in kept.items():
        if handler is not None:
            signal.signal(s, handler)


def _check_reachable(address: str, settings: tuple[str, str]) -> None:
    """A UsageError at once when nothing listens at ``address`` (``ray.init`` would retry for minutes)."""
    if address == "auto":
        return  # ray.init says at once when this machine belongs to no cluster
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT).close()
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{settings[0]}: no Ray cluster answers at {address} ({exc}); start it (ray start --head) "
            f"or fix {settings[1]}"
        ) from exc


class RayCopier:
    """Runs each copy (and re-hash) as a Ray task on the cluster at ``address`` (``"auto"``, ``"HOST:PORT"``
    or ``"ray://HOST:PORT"``), spread over its nodes by :class:`~.node_spread.NodeSpread`, under
    ``bandwidth``'s limits."""

    def __init__(
        self,
        bandwidth: Bandwidth,
        *,
        address: str = "auto",
        max_retries: int = 3,
        task_cpus: float = 1.0,
        chunk_size: int = CHUNK_SIZE,
        max_concurrency: int = 256,
        settings: tuple[str, str] = CONFIG_SETTINGS,
    ) -> None:
        """``settings`` name, in errors, what chose this engine and its address (config keys or flags)."""
        ray = self._ray = import_ray(settings[0])
        self.bandwidth = bandwidth
        self.chunk_size = chunk_size
        self._started_here = not ray.is_initialized()
        if self._started_here:
            _check_reachable(address, settings)
            kept = _stop_handlers()
            try:
                init_ray(ray, address, f"{settings[0]}: cannot reach the Ray cluster at {address}",
                         logging_level="WARNING", log_to_driver=False)  # fmt: skip
            finally:
                _restore(kept)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._affinity = NodeAffinitySchedulingStrategy
        self._task_opts: dict[str, Any] = {"max_retries": max_retries, "retry_exceptions": False,
                                           "num_cpus": task_cpus}  # fmt: skip
        self._copy = ray.remote(copy_task)
        self._verify = ray.remote(verify_task)
        self._spread = NodeSpread(lambda: self._alive_nodes(task_cpus))
        # beside the daemon (its node's death is the daemon's too), taking no CPU from the copies
        here = ray.get_runtime_context().get_node_id()

        # restarted (with its calls retried) should its node or process die: it then starts from the
        # rates it was made with, and the next copy hands it the current ones
        self._governor = (
            ray.remote(Governor)
            .options(
                max_concurrency=max_concurrency,
                num_cpus=0,
                max_restarts=-1,
                max_task_retries=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
            )
            .remote(self._rates())
        )
        self._cancel_sent = False
        self._lock = threading.Lock()
        self._closed = False
        bandwidth.watch(self._push_rates)

    def _alive_nodes(self, task_cpus: float) -> list[str]:
        """The ids of the alive nodes that can run a copy task (enough CPUs for one)."""
        return [n["NodeID"] for n in self._ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= task_cpus]  # fmt: skip

    def _submit(self, fn: Any, *args: Any) -> tuple[Any, str | None]:
        """Start ``fn`` as a task on the node :class:`NodeSpread` picks: (its ref, the node). The affinity is
        soft: should that node die, Ray runs the task (and its retries) on another."""
        node = self._spread.acquire()
        strategy = "SPREAD" if node is None else self._affinity(node, soft=True)
        try:
            return fn.options(scheduling_strategy=strategy, **self._task_opts).remote(*args), node
        except BaseException:
            self._spread.release(node)
            raise

    def _rates(self) -> Rates:
        b = self.bandwidth
        return b.global_bucket.rate, b.link_rates(), b.node_rate

    def _push_rates(self) -> None:
        with self._lock:
            if not self._closed:
                self._governor.set_rates.remote(self._rates())

    def _cancel(self) -> None:
        with self._lock:
            if not self._cancel_sent and not self._closed:
                self._cancel_sent = True
                self._governor.cancel.remote()

    def copy(
        self,
        src: Location,
        dst: Location,
        path: str,
        size: int,
        digest: str,
        *,
        create_only: bool,
        link: str,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        key = uuid.uuid4().hex
        self._push_rates()
        ref, node = self._submit(self._copy, src, dst, (path, size, digest), self.chunk_size, create_only, link,
                                 self._governor, key)  # fmt: skip
        seen = 0

        def report() -> None:  # progress is best effort: a governor being restarted reports nothing meanwhile
            nonlocal seen
            try:
                moved = int(self._ray.get(self._governor.moved.remote(key), timeout=PROGRESS_SECONDS * 4))
            except (self._ray.exceptions.RayError, TimeoutError):
                return
            if moved > seen:
                progress(moved - seen)
                seen = moved

        try:
            error = self._wait(ref, cancel, report)
            report()
        finally:
            self._spread.release(node)
            self._governor.forget.remote(key)
        if error is not None:
            raise error

    def verify(self, dst: Location, path: str, size: int, digest: str, *, cancel: threading.Event) -> str | None:
        ref, node = self._submit(self._verify, dst, (path, size, digest), self.chunk_size)
        try:
            got = self._wait(ref, cancel, None)
        finally:
            self._spread.release(node)
        if isinstance(got, FerryError):
            raise got
        return got

    def _wait(self, ref: Any, cancel: threading.Event, report: Any) -> Any:
        """The task's value, polling progress every PROGRESS_SECONDS; Cancelled once ``cancel`` is set and
        the task has not ended within _CANCEL_GRACE; a StorageError (retryable) when Ray lost the task or it
        crashed (any error other than the FerryError a task returns: none may end a copy thread)."""
        ray = self._ray
        cancelled_at: float | None = None
        while True:
            done, _ = ray.wait([ref], timeout=PROGRESS_SECONDS)
            if done:
                break
            if cancel.is_set():
                self._cancel()
                cancelled_at = cancelled_at or time.monotonic()
                if time.monotonic() - cancelled_at > _CANCEL_GRACE:
                    raise Cancelled()
            if report is not None:
                report()
        try:
            return ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - Ray's errors (a lost worker, node or object) and a task's crash
            if cancel.is_set():
                raise Cancelled() from exc
            self._spread.forget_listing()
            raise StorageError(f"the Ray task copying the shard was lost ({type(exc).__name__}: {exc})") from exc

    def transfers_by_node(self) -> dict[str, int]:
        """Ray node id → how many copies moved bytes there since this copier started."""
        return dict(self._ray.get(self._governor.transfers_by_node.remote()))

    def close(self) -> None:
        """Stop the governor; disconnect from Ray where this copier connected."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        ray = self._ray
        try:
            ray.kill(self._governor)
        finally:
            if self._started_here:
                ray.shutdown()
