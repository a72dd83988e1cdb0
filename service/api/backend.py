"""What the HTTP layer needs from the daemon, as a Protocol the app codes against.

``DaemonBackend`` (in ``daemon_backend``) implements it over the real ``ferry.service.daemon.Daemon``;
keeping the app on this narrow face lets the routes stay thin and the adapter own the mapping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ferry.shard_tools.errors import InvalidValueError

from .models import (
    ActionResult,
    ClusterOut,
    DatasetDetail,
    DatasetSummary,
    ErrorEntry,
    EventOut,
    HistoryEntry,
    LimitsIn,
    LimitsOut,
    LinkOut,
    ReplicaMatrix,
    RetryIn,
    ScrubIn,
    StatusOut,
    SyncIn,
    ThroughputOut,
    TransferOut,
)

__all__ = ["ApiBackend", "Invalid", "Unsubscribe"]

# A request naming a dataset, link, cluster or error id the daemon does not know raises
# ferry.shard_tools.errors.NotFoundError (HTTP 404); the app maps nothing else to 404.


class Invalid(InvalidValueError):
    """The request is well-formed but the daemon refuses its values (HTTP 422)."""


Unsubscribe = Callable[[], None]


class ApiBackend(Protocol):
    """Read and control operations the API exposes; every method is cheap and thread-safe."""

    def clusters(self) -> list[ClusterOut]: ...
    def datasets(self) -> list[DatasetSummary]: ...
    def dataset(self, name: str, shard_limit: int) -> DatasetDetail: ...  # NotFoundError: 404
    def replicas(self) -> ReplicaMatrix: ...
    def transfers(self) -> list[TransferOut]: ...
    def history(self, limit: int, dataset: str | None) -> list[HistoryEntry]: ...
    def errors(self, limit: int) -> list[ErrorEntry]: ...
    def links(self) -> list[LinkOut]: ...
    def throughput(self, seconds: float, buckets: int) -> ThroughputOut: ...
    def limits(self) -> LimitsOut: ...
    def status(self) -> StatusOut: ...
    def ready(self) -> bool: ...
    def copied_bytes(self) -> dict[tuple[str, str, str], int]:
        """Bytes copied since start, keyed (dataset, source, destination)."""
        ...

    def subscribe(self, callback: Callable[[EventOut], None]) -> Unsubscribe:
        """Call ``callback`` (from any thread) for each daemon event until unsubscribed."""
        ...

    def sync(self, req: SyncIn) -> ActionResult: ...
    def pause(self) -> ActionResult: ...
    def resume(self) -> ActionResult: ...
    def set_limits(self, req: LimitsIn) -> LimitsOut: ...
    def scrub(self, req: ScrubIn) -> ActionResult: ...
    def retry(self, req: RetryIn) -> ActionResult: ...
