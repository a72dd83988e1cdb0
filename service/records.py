"""Plain read-only records the daemon hands out (the API turns them into its response records).

Every record is a frozen dataclass of JSON-friendly fields: str, int, float, bool, None,
lists and dicts of those. Times are Unix seconds (float); sizes are bytes; rates bytes/s.
Field names are the API's: ``client/service/service_types.py`` defines the API's records (``service/api/models.py``
builds the OpenAPI schema from them), and five of them are the daemon's too, under the names the daemon gives
them here: ``ClusterInfo``, ``TransferInfo``, ``HistoryEntry``, ``ErrorInfo`` and ``LimitsInfo``:
``source``/``destination`` for the two ends of a copy, ``reason`` for why something failed,
``rate_bps`` for a rate. Events use the same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferry.client.service.service_types import Cluster as ClusterInfo  # a configured cluster
from ferry.client.service.service_types import ErrorEntry as ErrorInfo  # an open error (a shard, or a whole dataset)
from ferry.client.service.service_types import HistoryEntry  # a finished transfer attempt (ok or not)
from ferry.client.service.service_types import Limits as LimitsInfo  # the limits in force, as changed at run time
from ferry.client.service.service_types import Transfer as TransferInfo  # a copy in flight

__all__ = [
    "ClusterInfo",
    "DatasetInfo",
    "ReplicaStatus",
    "TransferInfo",
    "HistoryEntry",
    "ErrorInfo",
    "VersionTiming",
    "Egress",
    "EGRESS_VERSIONS",
    "ErrorCount",
    "StatsSnapshot",
    "LimitsInfo",
    "ScrubReport",
    "EVENT_TYPES",
]

#: ``type`` values of the event dicts delivered by ``Daemon.subscribe()``.
EVENT_TYPES = (
    "progress",  # {dataset, shard, source, destination, bytes_done, bytes_total, rate_bps}
    "shard_verified",  # {dataset, version, shard, source, destination, bytes, duration_s}
    "version_published",  # {dataset, version, cluster}
    "error",  # {id, dataset, version, cluster, shard, reason, retryable, attempts}  (cluster: where it failed)
    "scrub",  # {dataset, cluster, checked, bad, repaired}
    "state",  # {paused: bool} or {paused, limits: {transfers, global_bps, links}} after a control call
    "pass",  # {dataset, source, destination, copied, failed, published: bool}  (end of one sync pass)
)


@dataclass(frozen=True)
class ReplicaStatus:
    """One cell of the dataset × cluster matrix; ``state`` takes the values of the API's ``CellState``."""

    dataset: str
    cluster: str
    role: str  # "source" | "destination"
    target_version: str | None  # the source's current version
    published_version: str | None  # what the cluster's manifest.json names now
    verified_shards: int
    total_shards: int
    verified_bytes: int
    total_bytes: int
    state: str
    lag_seconds: float | None  # None when complete; else seconds since the source version was first seen


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset some rule replicates, as last seen at its source."""

    name: str
    source: str  # cluster name
    destinations: list[str]
    version: str | None  # the source's current version id (None if the source has none yet)
    versions: list[str]  # versions seen at the source, oldest first (as far as known)
    shards: int
    bytes: int
    tokens: int
    replicas: list[ReplicaStatus] = field(default_factory=list)  # one per cluster incl. the source


EGRESS_VERSIONS = 5  # versions per link the daemon reports egress for (its State keeps every version's row)


@dataclass(frozen=True)
class Egress:
    """Bytes a version of a dataset sent from ``source`` to ``destination`` (every copy attempt's), by the
    last time one was added."""

    dataset: str
    version: str
    source: str
    destination: str
    bytes: int
    last: float


@dataclass(frozen=True)
class VersionTiming:
    """When a version was wanted at a cluster (the earlier of its creation and a pass first seeing it
    missing there), and when it was published there (None: not yet)."""

    dataset: str
    cluster: str
    version: str
    first_seen: float
    completed: float | None


@dataclass(frozen=True)
class ErrorCount:
    dataset: str
    cluster: str
    kind: str  # "retryable" | "fatal" | "corrupt" (digest mismatch detected while copying or scrubbing)
    count: int


@dataclass(frozen=True)
class StatsSnapshot:
    """Counters for /metrics and the dashboard (rclone accounting style)."""

    copied_bytes_total: int  # verified bytes written since start
    bytes_read: int  # bytes read including failed attempts
    transfers_ok: int
    transfers_failed: int
    corrupt_detected: int
    rate_bps: float  # bytes/s over the last few seconds (0 when idle; see Stats)
    rate_avg: float  # bytes/s over the last 10 s
    pending_bytes: int
    pending_shards: int
    eta_seconds: float | None
    transfers_in_flight: int
    uptime_seconds: float
    errors: list[ErrorCount]  # failed attempts since start, by kind (open errors: Daemon.errors())


@dataclass(frozen=True)
class ScrubReport:
    dataset: str
    cluster: str
    checked: int
    bad: list[str]
    repaired: list[str]
    started_at: float
    duration_s: float
    extra: dict[str, Any] = field(default_factory=dict)
