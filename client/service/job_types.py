"""Typed records of the service's ``/api/v1/jobs`` API: what a loader registers, what it heartbeats, and
what the daemon says about each job it knows.

The one definition of each record: the service builds its request and response models from these
dataclasses (``ferry.service.api.job_models``), the loader sends them (``ferry.client.service.jobs``) and
``ferry status`` reads them, without importing the service. Unknown fields from a newer server are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Job", "JobAck", "JobEra", "JobPhase", "JobSource", "JobStats", "Heartbeat", "Registration", "SourcePlan"]


@dataclass(frozen=True)
class JobEra:
    """An earlier version a re-planned run read: ``epochs`` epochs of ``samples`` samples in its first ``shards``."""

    version: str
    samples: int
    shards: int
    epochs: int


@dataclass(frozen=True)
class SourcePlan:
    """One dataset a job reads, as its loader has it: everything its read order is a pure function of."""

    urls: list[str]  # its replicas, nearest first (as the loader was given them)
    version: str  # the version it reads
    seed: str  # decimal digits: seeds take 64 bits, more than a JSON number carries exactly
    shuffle: str  # global | window | none
    window: int  # shards per shuffle window (used by shuffle="window")
    mode: str  # tokens | document
    seq_len: int
    eras: list[JobEra] = field(default_factory=list)  # earlier versions of a re-planned run


@dataclass(frozen=True)
class JobPhase:
    """From global sample ``start`` on, source ``j`` gets ``quota[j]`` of every ``sum(quota)`` positions."""

    start: int
    quota: list[int]


@dataclass(frozen=True)
class Registration:
    """``POST /api/v1/jobs``: one loader (one rank of a job) and its plan."""

    name: str
    rank: int
    world_size: int
    batch_size: int
    sources: list[SourcePlan]
    phases: list[JobPhase]  # one phase [0, [1]] for a single dataset; a mixture's schedule with its re-plans
    host: str = ""
    pid: int = 0
    heartbeat_s: float = 5.0  # the loader heartbeats this often; the job expires after a few missed ones


@dataclass(frozen=True)
class JobStats:
    """What the loader's own counters say (``ferry.client.stats.summarise``), since it started."""

    stall_share: float = 0.0  # share of the loop's wall time spent waiting on data
    stall_s: float = 0.0
    wall_s: float = 0.0
    batches: int = 0
    delivered_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    fetch_p50_s: float | None = None  # request latency over all replicas (bucket upper bounds)
    fetch_p99_s: float | None = None
    replica_bytes: dict[str, int] = field(default_factory=dict)  # bytes received per replica URL


@dataclass(frozen=True)
class Heartbeat:
    """``PUT /api/v1/jobs/{id}``: where the loader stands now."""

    position: int  # global samples delivered (the stream position of the next batch)
    epoch: int
    samples_per_second: float  # global samples consumed per second since the previous heartbeat
    stats: JobStats = field(default_factory=JobStats)
    registration: Registration | None = None  # a changed plan (a loaded state re-planned the run)


@dataclass(frozen=True)
class JobAck:
    """The answer to a registration or heartbeat."""

    id: str
    expires_in_s: float  # without a heartbeat the daemon forgets the job after this long


@dataclass(frozen=True)
class JobSource:
    """One dataset of a job as the daemon resolved it against its clusters."""

    replica: str  # the replica URL the loader read most bytes from (credentials stripped)
    dataset: str | None  # the dataset's name, when one of its URLs lies in a configured cluster
    cluster: str | None  # the cluster holding that replica (None: outside every cluster, e.g. staging)
    version: str
    shuffle: str
    seed: str


@dataclass(frozen=True)
class Job:
    """One registered loader (one rank of a training job)."""

    id: str
    name: str
    rank: int
    world_size: int
    batch_size: int
    host: str
    pid: int
    sources: list[JobSource]
    phases: int  # mixture phases of its schedule
    registered_at: float
    last_seen: float  # unix time of its last heartbeat
    position: int
    epoch: int
    samples_per_second: float
    stats: JobStats
    staged_ahead_bytes: int | None = None  # bytes staged for it ahead of its position (None: no staging)
