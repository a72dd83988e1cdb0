"""Pydantic models of every API request and response body (the OpenAPI schema is generated from them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .auth import NAME_MAX_LENGTH, NAME_PATTERN

__all__ = [
    "ActionResult",
    "ClusterOut",
    "DatasetDetail",
    "DatasetSummary",
    "ErrorEntry",
    "EventOut",
    "HealthOut",
    "HistoryEntry",
    "LimitsIn",
    "LimitsOut",
    "LinkOut",
    "ReplicaCell",
    "ReplicaMatrix",
    "RetryIn",
    "ScrubIn",
    "StatusOut",
    "SyncIn",
    "ThroughputOut",
    "ThroughputPoint",
    "TransferOut",
]

CellState = Literal["source", "complete", "syncing", "failed", "paused", "unknown"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterOut(_Out):
    """A named storage location. ``url`` never carries credentials (userinfo and query are stripped)."""

    name: str
    url: str
    protocol: str
    priority: int = Field(description="lower = preferred as a copy source")
    is_source: bool = Field(description="true when some rule replicates from this cluster")
    is_destination: bool = Field(description="true when some rule replicates to this cluster")


class DatasetSummary(_Out):
    """One replicated dataset as the source cluster publishes it."""

    name: str
    source: str = Field(description="cluster the dataset is replicated from")
    destinations: list[str]
    version: str | None = Field(description="current version id at the source (null when not readable yet)")
    versions: int = Field(description="number of versions seen at the source")
    shards: int
    bytes: int = Field(description="stored (compressed) bytes of the current version")
    tokens: int


class ReplicaCell(_Out):
    """Completeness of one dataset on one cluster."""

    dataset: str
    cluster: str
    role: Literal["source", "destination"]
    state: CellState
    published_version: str | None = Field(description="version named by this cluster's manifest (null when none)")
    target_version: str | None = Field(description="version the cluster is converging to")
    verified_shards: int
    total_shards: int
    verified_bytes: int
    total_bytes: int
    percent: float = Field(ge=0, le=100)
    lag_seconds: float | None = Field(description="seconds since the target version was first seen; null when complete")


class DatasetDetail(_Out):
    """A dataset with its versions, shard totals and completeness per cluster."""

    name: str
    source: str
    destinations: list[str]
    version: str | None
    versions: list[str] = Field(description="versions seen at the source, oldest first")
    shards: int
    bytes: int
    tokens: int
    replicas: list[ReplicaCell]


class ReplicaMatrix(_Out):
    """The dataset × cluster completeness matrix."""

    datasets: list[str]
    clusters: list[str]
    cells: list[ReplicaCell]


class TransferOut(_Out):
    """A shard copy in flight."""

    id: int
    dataset: str
    version: str
    shard: str
    source: str
    destination: str
    bytes_done: int
    bytes_total: int
    percent: float = Field(ge=0, le=100)
    rate_bps: float = Field(description="bytes per second since the copy started")
    started_at: float = Field(description="unix time")


class HistoryEntry(_Out):
    """A finished transfer attempt, successful or not."""

    id: int
    dataset: str
    version: str
    shard: str
    source: str
    destination: str
    bytes: int
    started_at: float
    duration_s: float
    ok: bool
    error: str | None


class ErrorEntry(_Out):
    """An open replication error."""

    id: int
    at: float
    dataset: str
    version: str
    cluster: str = Field(description="destination cluster")
    shard: str
    reason: str
    retryable: bool
    attempts: int


class LinkOut(_Out):
    """One source → destination link: lag, SLA attainment and bandwidth limit."""

    source: str
    destination: str
    lag_seconds: float | None
    sla_minutes: float
    versions_total: int
    versions_within_sla: int
    share_within_sla: float | None = Field(
        description="fraction of versions replicated within the SLA; null if none yet"
    )
    limit_bps: float | None = Field(description="bandwidth limit of the link in bytes/s; null = unlimited")
    rate_bps: float = Field(description="current copy rate in bytes/s")


class ThroughputPoint(_Out):
    """Bytes per second averaged over one bucket ending at ``t``."""

    t: float
    bps: float


class ThroughputOut(_Out):
    """Copy throughput over the recent past (default: the last hour)."""

    bucket_seconds: float
    points: list[ThroughputPoint]


class LimitsOut(_Out):
    """Current limits: parallel transfers and bandwidth (bytes/s; null = unlimited)."""

    transfers: int
    global_bps: float | None
    links: dict[str, float | None] = Field(description='per link, keyed "source->destination"')


class OtherWriterOut(_Out):
    """Another writer (a daemon, a ``ferry sync``) holding a destination's lease, seen by the last pass."""

    dataset: str
    cluster: str = Field(description="the destination whose lease the other writer holds")
    holder: str = Field(description="kind:host:pid:id of the lease holder")


class StatusOut(_Out):
    """Daemon state in one call: paused, limits, counters."""

    paused: bool
    ready: bool
    version: str
    uptime_seconds: float
    transfers_in_flight: int
    open_errors: int = Field(description="open errors, as /errors lists them (counted up to 10000)")
    copied_bytes_total: int
    rate_bps: float
    pending_bytes: int
    pending_shards: int
    eta_seconds: float | None
    limits: LimitsOut
    sla_minutes: float
    read_protected: bool
    other_writers: list[OtherWriterOut] = Field(
        default_factory=list, description="destinations another writer's lease kept this daemon out of"
    )


class HealthOut(_Out):
    """Liveness / readiness."""

    status: Literal["ok", "starting"]


class ActionResult(_Out):
    """Answer to a control call."""

    ok: bool
    message: str
    affected: int = 0


class EventOut(_Out):
    """One Server-Sent Event payload (``event:`` is ``kind``).

    ``data`` uses the names of the records above: a ``progress`` event carries TransferOut's
    ``dataset, shard, source, destination, bytes_done, bytes_total, rate_bps``; ``shard_verified``
    ``dataset, version, shard, source, destination, bytes, duration_s``; ``error`` ErrorEntry's
    ``id, dataset, version, cluster, shard, reason, retryable, attempts``; ``state`` ``paused`` and
    LimitsOut's ``transfers, global_bps, links``.
    """

    kind: str
    time: float
    data: dict[str, object]


def _whole_number(value: object) -> object:
    """``3.0`` is the integer 3: JSON has one number type (JSON Schema's ``integer`` says the same)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Request numbers are strict: ``true`` or ``"3"`` is refused (422), not read as 1 or 3. A strict float
# still takes a JSON integer, an integer field a whole float (bounds go before the validator, so the
# OpenAPI schema states them).
WholeNumber = BeforeValidator(_whole_number)
Rate = Annotated[float, Field(ge=0, le=1e13, strict=True)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SyncIn(_In):
    """Sync now: everything, or narrowed to one dataset and/or the links from ``source`` / to ``destination``."""

    dataset: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)
    source: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)
    destination: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)


class LimitsIn(_In):
    """New limits (bandwidth in bytes/s). Omitted fields are unchanged; a bandwidth of ``0`` means unlimited."""

    transfers: Annotated[int, Field(ge=1, le=1024, strict=True), WholeNumber] | None = None
    global_bps: Rate | None = None
    links: dict[str, Rate] | None = Field(
        default=None, description='per link, keyed "source->destination"; 0 = unlimited', max_length=256
    )


class ScrubIn(_In):
    """Re-verify replicas (optionally one dataset / cluster) and repair from a healthy copy."""

    dataset: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)
    cluster: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)


class RetryIn(_In):
    """Retry failed work: one error by id, or every open error when ``id`` is omitted."""

    # le: the largest integer a JSON number carries exactly
    id: Annotated[int, Field(ge=0, le=2**53 - 1, strict=True), WholeNumber] | None = None
