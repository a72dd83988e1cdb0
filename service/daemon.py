"""The long-running replication daemon (skeleton: interface fixed, see INTERFACE.md)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

from .config import Config
from .views import (
    ClusterInfo,
    DatasetInfo,
    ErrorInfo,
    HistoryEntry,
    LimitsInfo,
    ReplicaStatus,
    ScrubReport,
    StatsSnapshot,
    TransferInfo,
)

__all__ = ["Daemon", "UNCHANGED"]

UNCHANGED: Any = object()


class Daemon:
    """Polls the rules, runs sync passes and scrubs on background threads."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._stopped = threading.Event()
        self._paused = False
        self._subscribers: list[queue.Queue[dict[str, Any]]] = []

    @property
    def config(self) -> Config:
        return self._config

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    @property
    def paused(self) -> bool:
        return self._paused

    def start(self) -> None:
        pass

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def clusters(self) -> list[ClusterInfo]:
        return [ClusterInfo(c.name, c.public_url, c.priority) for c in self._config.clusters.values()]

    def datasets(self) -> list[DatasetInfo]:
        return []

    def dataset(self, name: str) -> DatasetInfo:
        raise KeyError(name)

    def replica_matrix(self) -> list[ReplicaStatus]:
        return []

    def transfers(self) -> list[TransferInfo]:
        return []

    def history(self, limit: int = 100, dataset: str | None = None) -> list[HistoryEntry]:
        return []

    def errors(self, limit: int = 100) -> list[ErrorInfo]:
        return []

    def stats(self) -> StatsSnapshot:
        return StatsSnapshot(0, 0, 0, 0, 0, 0.0, 0.0, 0, 0, None, 0, self._paused, 0.0, [], [])

    def limits(self) -> LimitsInfo:
        lim = self._config.limits
        return LimitsInfo(lim.transfers, lim.bwlimit, dict(lim.per_link))

    def scrub_reports(self, limit: int = 20) -> list[ScrubReport]:
        return []

    def subscribe(self, maxsize: int = 1000) -> queue.Queue[dict[str, Any]]:
        q: queue.Queue[dict[str, Any]] = queue.Queue(maxsize)
        self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue[dict[str, Any]]) -> None:
        if q in self._subscribers:
            self._subscribers.remove(q)

    def sync_now(self, dataset: str | None = None, link: tuple[str, str] | None = None) -> int:
        return 0

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def set_limits(
        self,
        *,
        bwlimit: Any = UNCHANGED,
        per_link: Mapping[str, float | str | None] | None = None,
        transfers: int | None = None,
    ) -> LimitsInfo:
        return self.limits()

    def scrub(self, dataset: str | None = None, cluster: str | None = None) -> int:
        return 0

    def retry(self, error_id: int | None = None) -> int:
        return 0
