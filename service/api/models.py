"""Pydantic models of every API request and response body (the OpenAPI schema is generated from them).

A response record's fields are owned by its dataclass in ``ferry.client.service.service_types`` (which the client
reads responses into, without importing the service); its model here is built from that dataclass and adds
only what the API states about it: descriptions, bounds, the values a string takes.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from ferry.client.service import service_types as wire

from ..records import EGRESS_VERSIONS
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
    "LinkEgressOut",
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


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


_MODELS: dict[type, type[BaseModel]] = {}  # record class of ferry.client.service.service_types -> its model here


def _api_type(tp: Any) -> Any:
    """``tp`` with every record class of ferry.client.service.service_types replaced by its model (in lists and
    unions too)."""
    if tp in _MODELS:
        return _MODELS[tp]
    if get_origin(tp) is list:
        return list[_api_type(get_args(tp)[0])]  # type: ignore[misc]
    if get_origin(tp) in (Union, types.UnionType):
        return Union[tuple(_api_type(arg) for arg in get_args(tp))]  # noqa: UP007 (built from a tuple)
    return tp


def response_model(record: type, name: str, doc: str, /, **fields: dict[str, Any]) -> type[BaseModel]:
    """The response model ``name`` of ``record``, a dataclass of ferry.client.service.service_types, which owns
    the record: its field names, their order, types and defaults. ``fields`` adds what only the API
    states, per field: ``Field`` arguments (description, bounds) and, under ``"annotation"``, a narrower
    type (a Literal of the values a str takes). ``doc`` is the schema's description.
    """
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(record)})
    if unknown:
        raise TypeError(f"{name}: {', '.join(unknown)} not a field of {record.__qualname__}")
    hints = typing.get_type_hints(record)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        extra = dict(fields.get(f.name, {}))
        annotation = extra.pop("annotation", _api_type(hints[f.name]))
        if f.default is not dataclasses.MISSING:
            extra["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            extra["default_factory"] = f.default_factory
        spec[f.name] = (annotation, Field(**extra))
    model = create_model(name, __base__=_Out, __doc__=doc, __module__=__name__, **spec)
    _MODELS[record] = model
    return model


if TYPE_CHECKING:  # to a type checker each model is its record (the same fields); at run time, the model
    from ferry.client.service.service_types import (
        ActionResult,
        DatasetDetail,
        DatasetSummary,
        ErrorEntry,
        HistoryEntry,
        ReplicaCell,
        ReplicaMatrix,
        ThroughputPoint,
    )
    from ferry.client.service.service_types import Cluster as ClusterOut
    from ferry.client.service.service_types import Limits as LimitsOut
    from ferry.client.service.service_types import Link as LinkOut
    from ferry.client.service.service_types import LinkEgress as LinkEgressOut
    from ferry.client.service.service_types import OtherWriter as OtherWriterOut
    from ferry.client.service.service_types import Status as StatusOut
    from ferry.client.service.service_types import Throughput as ThroughputOut
    from ferry.client.service.service_types import Transfer as TransferOut
else:
    ClusterOut = response_model(
        wire.Cluster,
        "ClusterOut",
        "A named storage location. ``url`` never carries credentials (userinfo and query are stripped).",
        priority={"description": "lower = preferred as a copy source"},
        is_source={"description": "true when some rule replicates from this cluster"},
        is_destination={"description": "true when some rule replicates to this cluster"},
    )
    DatasetSummary = response_model(
        wire.DatasetSummary,
        "DatasetSummary",
        "One replicated dataset as the source cluster publishes it.",
        source={"description": "cluster the dataset is replicated from"},
        version={"description": "current version id at the source (null when not readable yet)"},
        versions={"description": "number of versions seen at the source"},
        bytes={"description": "stored (compressed) bytes of the current version"},
    )
    ReplicaCell = response_model(
        wire.ReplicaCell,
        "ReplicaCell",
        "Completeness of one dataset on one cluster.",
        published_version={"description": "version named by this cluster's manifest (null when none)"},
        target_version={"description": "version the cluster is converging to"},
        percent={"ge": 0, "le": 100},
        lag_seconds={"description": "seconds since the target version was first seen; null when complete"},
    )
    DatasetDetail = response_model(
        wire.DatasetDetail,
        "DatasetDetail",
        "A dataset with its versions, shard totals and completeness per cluster.",
        versions={"description": "versions seen at the source, oldest first"},
    )
    ReplicaMatrix = response_model(wire.ReplicaMatrix, "ReplicaMatrix", "The dataset × cluster completeness matrix.")
    TransferOut = response_model(
        wire.Transfer,
        "TransferOut",
        "A shard copy in flight.",
        percent={"ge": 0, "le": 100},
        rate_bps={"description": "bytes per second since the copy started"},
        started_at={"description": "unix time"},
    )
    HistoryEntry = response_model(wire.HistoryEntry, "HistoryEntry", "A finished transfer attempt, successful or not.")
    ErrorEntry = response_model(
        wire.ErrorEntry, "ErrorEntry", "An open replication error.", cluster={"description": "destination cluster"}
    )
    LinkEgressOut = response_model(
        wire.LinkEgress,
        "LinkEgressOut",
        "Bytes one version sent over a link, every copy attempt's (as this daemon counted them), and their price.",
        bytes={"ge": 0},
        cost={"description": "bytes / 10^9 × the link's price_per_gb", "ge": 0},
    )
    LinkOut = response_model(
        wire.Link,
        "LinkOut",
        "One source → destination link: lag, SLA attainment, bandwidth limit, rate and egress. A rule's link, or any "
        "other link copies into this daemon's destinations went over (a swarm peer, a nearer replica).",
        share_within_sla={"description": "fraction of versions replicated within the SLA; null if none yet"},
        limit_bps={"description": "bandwidth limit of the link in bytes/s; null = unlimited"},
        rate_bps={"description": "current copy rate in bytes/s"},
        capacity_bps={"description": "capacity [[links]] declares, in bytes/s (what the route planner plans with)"},
        price_per_gb={"description": "egress price [[links]] declares, per 10^9 bytes (0 when none)"},
        egress={"description": f"the last versions (up to {EGRESS_VERSIONS}) that sent bytes over it, newest first"},
        planned_bps={
            "description": "the rate the last routed swarm plan into its destination gives the link, bytes/s "
            "([swarm] routed); null = no routed plan uses it, or its links have no capacity"
        },
    )
    ThroughputPoint = response_model(
        wire.ThroughputPoint, "ThroughputPoint", "Bytes per second averaged over one bucket ending at ``t``."
    )
    ThroughputOut = response_model(
        wire.Throughput, "ThroughputOut", "Copy throughput over the recent past (default: the last hour)."
    )
    LimitsOut = response_model(
        wire.Limits,
        "LimitsOut",
        "Current limits: parallel transfers and bandwidth (bytes/s; null = unlimited).",
        links={"description": 'per link, keyed "source->destination"'},
    )
    OtherWriterOut = response_model(
        wire.OtherWriter,
        "OtherWriterOut",
        "Another writer (a daemon, a ``ferry sync``) holding a destination's lease, seen by the last pass.",
        cluster={"description": "the destination whose lease the other writer holds"},
        holder={"description": "kind:host:pid:id of the lease holder"},
    )
    StatusOut = response_model(
        wire.Status,
        "StatusOut",
        "Daemon state in one call: paused, limits, counters.",
        open_errors={"description": "open errors, as /errors lists them (counted up to 10000)"},
        other_writers={"description": "destinations another writer's lease kept this daemon out of"},
    )
    ActionResult = response_model(wire.ActionResult, "ActionResult", "Answer to a control call.")


class HealthOut(_Out):
    """Liveness / readiness."""

    status: Literal["ok", "starting"]


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
