"""Typed records of the ferry service's JSON API: the one definition of each response record.

The service builds its response models (``ferry.service.api.models``, the OpenAPI schema) from these
dataclasses, and its daemon hands out ``HistoryEntry`` and ``Limits`` as they are; the client reads
responses into them without importing the service (this module needs neither pydantic nor fastapi).
Unknown fields from a newer server are ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

__all__ = [
    "ActionResult",
    "CellState",
    "Cluster",
    "DatasetDetail",
    "DatasetSummary",
    "ErrorEntry",
    "Event",
    "HistoryEntry",
    "Limits",
    "Link",
    "LinkEgress",
    "OtherWriter",
    "ReplicaCell",
    "ReplicaMatrix",
    "Status",
    "Throughput",
    "ThroughputPoint",
    "Transfer",
    "from_json",
]

T = TypeVar("T")

#: The state of one dataset on one cluster: "source" (the cluster the rule pulls from), "complete" (target
#: version published), "syncing" (copies in flight or pending), "failed" (some shard failed and waits for a
#: retry), "paused", or "unknown" (not planned yet).
CellState = Literal["source", "complete", "syncing", "failed", "paused", "unknown"]


@dataclass(frozen=True)
class Cluster:
    """A configured cluster. ``url`` never carries credentials."""

    name: str
    url: str
    protocol: str
    priority: int
    is_source: bool
    is_destination: bool


@dataclass(frozen=True)
class DatasetSummary:
    name: str
    source: str
    destinations: list[str]
    version: str | None
    versions: int
    shards: int
    bytes: int
    tokens: int


@dataclass(frozen=True)
class ReplicaCell:
    dataset: str
    cluster: str
    role: Literal["source", "destination"]
    state: CellState
    published_version: str | None
    target_version: str | None
    verified_shards: int
    total_shards: int
    verified_bytes: int
    total_bytes: int
    percent: float
    lag_seconds: float | None


@dataclass(frozen=True)
class DatasetDetail:
    name: str
    source: str
    destinations: list[str]
    version: str | None
    versions: list[str]
    shards: int
    bytes: int
    tokens: int
    replicas: list[ReplicaCell]


@dataclass(frozen=True)
class ReplicaMatrix:
    datasets: list[str]
    clusters: list[str]
    cells: list[ReplicaCell]

    def cell(self, dataset: str, cluster: str) -> ReplicaCell | None:
        """The cell of ``dataset`` on ``cluster`` (None when that pair is not replicated)."""
        for c in self.cells:
            if c.dataset == dataset and c.cluster == cluster:
                return c
        return None


@dataclass(frozen=True)
class _ShardCopy:
    """Which copy a record is about: its id, the shard of which version of which dataset, from where to where."""

    id: int
    dataset: str
    version: str
    shard: str
    source: str  # cluster name (or URL for `ferry sync`)
    destination: str


@dataclass(frozen=True)
class Transfer(_ShardCopy):
    """A shard copy in flight."""

    bytes_done: int
    bytes_total: int
    percent: float
    rate_bps: float
    started_at: float


@dataclass(frozen=True)
class HistoryEntry(_ShardCopy):
    """A finished transfer attempt, successful or not."""

    bytes: int
    started_at: float
    duration_s: float
    ok: bool
    error: str | None


@dataclass(frozen=True)
class ErrorEntry:
    """A shard (or, with version "", a whole dataset) that failed at a cluster and has not been repaired since."""

    id: int  # pass to retry
    at: float
    dataset: str
    version: str
    cluster: str
    shard: str
    reason: str
    retryable: bool
    attempts: int


@dataclass(frozen=True)
class LinkEgress:
    """Bytes one version of a dataset sent over a link (every copy attempt's, as this daemon counted them), and
    their price at the link's ``price_per_gb``."""

    dataset: str
    version: str
    bytes: int
    cost: float


@dataclass(frozen=True)
class Link:
    source: str
    destination: str
    lag_seconds: float | None
    sla_minutes: float
    versions_total: int
    versions_within_sla: int
    share_within_sla: float | None
    limit_bps: float | None
    rate_bps: float
    capacity_bps: float | None = None
    price_per_gb: float = 0.0
    egress: list[LinkEgress] = dataclasses.field(default_factory=list)
    planned_bps: float | None = None


@dataclass(frozen=True)
class ThroughputPoint:
    t: float
    bps: float


@dataclass(frozen=True)
class Throughput:
    bucket_seconds: float
    points: list[ThroughputPoint]


@dataclass(frozen=True)
class Limits:
    transfers: int
    global_bps: float | None
    links: dict[str, float | None]


@dataclass(frozen=True)
class OtherWriter:
    """Another writer holding a destination's lease (the daemon stays out of it meanwhile)."""

    dataset: str
    cluster: str
    holder: str


@dataclass(frozen=True)
class Status:
    paused: bool
    ready: bool
    version: str
    uptime_seconds: float
    transfers_in_flight: int
    open_errors: int
    copied_bytes_total: int
    rate_bps: float
    pending_bytes: int
    pending_shards: int
    eta_seconds: float | None
    limits: Limits
    sla_minutes: float
    read_protected: bool
    other_writers: list[OtherWriter] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str
    affected: int = 0


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event: ``kind`` (the ``event:`` line) and its JSON ``data``."""

    kind: str
    data: dict[str, Any]
    id: int | None = None


def from_json(cls: type[T], data: Any) -> T:
    """Build dataclass ``cls`` from decoded JSON, converting nested records and ignoring unknown keys."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = get_args(tp)
        return [_convert(item, v) for v in value]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_json(tp, value)
    return value
