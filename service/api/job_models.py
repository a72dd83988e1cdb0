"""Request and response models of ``/api/v1/jobs``, built from the records of
``ferry.client.service.job_types`` (which own the fields) with the bounds the API enforces."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from ferry.client.service import job_types as wire

from .auth import NAME_MAX_LENGTH, NAME_PATTERN
from .models import response_model

__all__ = ["HeartbeatIn", "JobAckOut", "JobOut", "RegistrationIn"]

MAX_SOURCES = 64
MAX_PHASES = 4096  # as ferry.client.sampling.schedule.MAX_PHASES
MAX_URLS = 16
_Url = Annotated[str, Field(min_length=1, max_length=2048)]
_SECONDS = 1e12  # a bound of the seconds a loader counts (finite: every number the API shows is)
_EXACT = 2**53 - 1  # integers a JSON number carries exactly (stream positions stay far below)

if TYPE_CHECKING:
    from ferry.client.service.job_types import Heartbeat as HeartbeatIn
    from ferry.client.service.job_types import Job as JobOut
    from ferry.client.service.job_types import JobAck as JobAckOut
    from ferry.client.service.job_types import Registration as RegistrationIn
else:
    response_model(
        wire.JobEra,
        "JobEraIn",
        "An earlier dataset version of a re-planned run: its epochs over its first shards.",
        version={"max_length": 256},
        samples={"ge": 0, "le": _EXACT},
        shards={"ge": 0, "le": _EXACT},
        epochs={"ge": 0, "le": _EXACT},
    )
    response_model(
        wire.SourcePlan,
        "SourcePlanIn",
        "One dataset a job reads: everything its read order is a pure function of.",
        urls={"annotation": list[_Url], "min_length": 1, "max_length": MAX_URLS},
        version={"max_length": 256},
        seed={"pattern": r"^[0-9]{1,20}$"},
        shuffle={"annotation": Literal["global", "window", "none"]},
        window={"ge": 1, "le": 2**31},
        mode={"annotation": Literal["tokens", "document"]},
        seq_len={"ge": 1, "le": 2**31},
        eras={"max_length": 1024},
    )
    response_model(
        wire.JobPhase,
        "JobPhaseIn",
        "A phase of a mixture schedule.",
        start={"ge": 0, "le": _EXACT},
        quota={"annotation": list[Annotated[int, Field(ge=0, le=2**31)]], "min_length": 1, "max_length": MAX_SOURCES},
    )
    RegistrationIn = response_model(
        wire.Registration,
        "RegistrationIn",
        "One loader (one rank of a training job) and its read plan.",
        name={"pattern": NAME_PATTERN, "max_length": NAME_MAX_LENGTH, "description": "the job's name"},
        rank={"ge": 0, "lt": 2**24},
        world_size={"ge": 1, "le": 2**24},
        batch_size={"ge": 1, "le": 2**24},
        sources={"min_length": 1, "max_length": MAX_SOURCES},
        phases={"min_length": 1, "max_length": MAX_PHASES},
        host={"max_length": 255},
        pid={"ge": 0, "lt": 2**32},
        heartbeat_s={"ge": 0.05, "le": 600, "allow_inf_nan": False, "description": "the loader heartbeats this often"},
    )
    JobStatsOut = response_model(
        wire.JobStats,
        "JobStats",
        "The loader's own counters since it started.",
        stall_share={"ge": 0, "le": 1, "allow_inf_nan": False},
        stall_s={"ge": 0, "le": _SECONDS, "allow_inf_nan": False},
        wall_s={"ge": 0, "le": _SECONDS, "allow_inf_nan": False},
        fetch_p50_s={"ge": 0, "le": _SECONDS, "allow_inf_nan": False},
        fetch_p99_s={"ge": 0, "le": _SECONDS, "allow_inf_nan": False},
        batches={"ge": 0},
        delivered_bytes={"ge": 0},
        cache_hits={"ge": 0},
        cache_misses={"ge": 0},
        replica_bytes={"annotation": dict[_Url, Annotated[int, Field(ge=0)]], "max_length": MAX_URLS * MAX_SOURCES},
    )
    HeartbeatIn = response_model(
        wire.Heartbeat,
        "HeartbeatIn",
        "Where the loader stands; ``registration`` only when its plan changed.",
        position={"ge": 0, "le": _EXACT},
        epoch={"ge": 0, "le": _EXACT},
        samples_per_second={"ge": 0, "le": 1e12, "allow_inf_nan": False},
    )
    JobAckOut = response_model(wire.JobAck, "JobAck", "The job's id and how long it lives without a heartbeat.")
    response_model(
        wire.JobSource,
        "JobSource",
        "A dataset of a job, resolved against the daemon's clusters.",
        replica={"description": "the replica URL the loader read most bytes from"},
        dataset={"description": "the dataset's name, when one of the loader's URLs lies in a configured cluster"},
        cluster={"description": "the cluster holding that replica (null: outside every cluster, e.g. staging)"},
    )
    JobOut = response_model(
        wire.Job,
        "JobOut",
        "One registered loader: its plan, where it stands and how much it waits on data.",
        last_seen={"description": "unix time of its last heartbeat"},
        staged_ahead_bytes={"description": "bytes staged for it ahead of its position (null: no staging)"},
    )
