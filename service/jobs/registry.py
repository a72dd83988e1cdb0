"""The jobs the daemon knows: loaders that registered their read plan and keep heartbeating.

In memory only (a job re-registers when the daemon restarts: its loader's next heartbeat is answered
404 and it registers again). A job that misses its heartbeats for ``misses`` intervals expires. The
registry holds at most ``max_jobs`` jobs: past that a registration is refused (the API's 503), so a
flood of registrations costs a bounded amount of memory.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferry.client.service.job_types import Heartbeat, Job, JobSource, JobStats, Registration
from ferry.shard_tools.errors import FerryError, NotFoundError

from ..config_types import redact

__all__ = [
    "plan_problem",
    "JobRegistry",
    "RegisteredJob",
    "RegistryFull",
    "StagingReport",
    "resolve_replica",
    "MAX_JOBS",
    "MISSES",
]

MAX_JOBS = 1024
MISSES = 3  # heartbeats a job may miss before it expires
_SLACK_S = 2.0  # on top of the missed heartbeats: a slow network, a loaded daemon

Clusters = Callable[[], Sequence[tuple[str, str]]]  # (name, url) of each configured cluster


class StagingReport(Protocol):
    """What staging says about a job (``ferry.service.jobs.stager``); None where it stages nothing for it."""

    def staged_ahead(self, job_id: str) -> int | None:
        """Bytes staged for the job ahead of its position."""
        ...

    def missing(self, job_id: str) -> int | None:
        """Bytes the job reads within the staging horizon that are not staged yet."""
        ...


class RegistryFull(FerryError):
    """As many jobs registered as the registry holds (the API answers 503)."""


@dataclass
class RegisteredJob:
    """One registration and the latest heartbeat (mutable under the registry's lock)."""

    id: str
    plan: Registration
    registered_at: float
    last_seen: float
    beat: Heartbeat

    def expires_at(self) -> float:
        return self.last_seen + MISSES * self.plan.heartbeat_s + _SLACK_S


class JobRegistry:
    """Thread-safe registry of jobs; ``clock`` is injectable for tests of expiry."""

    def __init__(
        self, clusters: Clusters = tuple, *, max_jobs: int = MAX_JOBS, clock: Callable[[], float] = time.time
    ) -> None:
        self._clusters = clusters
        self._max = max_jobs
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[str, RegisteredJob] = {}
        self.staging: StagingReport | None = None  # set by the daemon's stager, when staging is configured
        # called (outside the lock) when a job registers or sends a new plan: the stager plans again at once
        self.on_plan: Callable[[], None] | None = None

    def register(self, plan: Registration) -> RegisteredJob:
        """Add a job; RegistryFull when the registry holds ``max_jobs`` live jobs already. A plan no loader
        could have (``plan_problem``) is listed all the same, and staged for by no one."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            if len(self._jobs) >= self._max:
                raise RegistryFull(f"{len(self._jobs)} jobs registered, the most this daemon keeps")
            job_id = secrets.token_hex(8)
            job = RegisteredJob(job_id, plan, now, now, Heartbeat(position=0, epoch=0, samples_per_second=0.0))
            self._jobs[job_id] = job
            out = dataclasses.replace(job)
        self._planned()
        return out

    def heartbeat(self, job_id: str, beat: Heartbeat) -> RegisteredJob:
        """Record where job ``job_id`` stands (and its new plan, if it sends one); NotFoundError once it expired."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFoundError(f"no job {job_id!r}: it expired or was never registered; register again")
            job.last_seen = now
            job.beat = dataclasses.replace(beat, registration=None)
            if beat.registration is not None:
                job.plan = beat.registration
            out = dataclasses.replace(job)
        if beat.registration is not None:
            self._planned()
        return out

    def remove(self, job_id: str) -> None:
        """Forget a job (its loader closed); NotFoundError when it is not registered."""
        with self._lock:
            if self._jobs.pop(job_id, None) is None:
                raise NotFoundError(f"no job {job_id!r}")

    def live(self) -> list[RegisteredJob]:
        """The jobs not expired, oldest registration first (copies: safe to read without the lock)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            return sorted((dataclasses.replace(j) for j in self._jobs.values()), key=lambda j: j.registered_at)

    def jobs(self) -> list[Job]:
        """The live jobs as the API shows them, sources resolved against the clusters."""
        clusters = list(self._clusters())
        return [view(j, clusters, self.staged_ahead(j.id)) for j in self.live()]

    def job(self, job_id: str) -> Job:
        found = next((j for j in self.live() if j.id == job_id), None)
        if found is None:
            raise NotFoundError(f"no job {job_id!r}")
        return view(found, list(self._clusters()), self.staged_ahead(job_id))

    def staged_ahead(self, job_id: str) -> int | None:
        return None if self.staging is None else self.staging.staged_ahead(job_id)

    def missing(self, job_id: str) -> int | None:
        return None if self.staging is None else self.staging.missing(job_id)

    def _planned(self) -> None:
        if self.on_plan is not None:
            self.on_plan()

    def _expire(self, now: float) -> None:
        for job_id in [k for k, j in self._jobs.items() if j.expires_at() < now]:
            del self._jobs[job_id]


def plan_problem(plan: Registration) -> str | None:
    """Why no loader could have this plan (its schedule breaks the loader's rules, it names other sources than
    it has, a URL does not parse, its rank is past its world size), or None."""
    # numpy comes with it: loaded when a plan is checked, not by every import of the API
    from ferry.client.sampling.schedule import Schedule

    try:
        schedule = Schedule([(p.start, p.quota) for p in plan.phases])
    except ValueError as exc:
        return f"phases: {exc}"
    if schedule.sources != len(plan.sources):
        return f"phases name {schedule.sources} sources, the plan has {len(plan.sources)}"
    for source in plan.sources:
        for url in source.urls:
            try:
                redact(url)  # parses it: host, port
            except ValueError as exc:
                return f"sources: cannot read URL {url[:80]!r}: {exc}"
    if plan.rank >= plan.world_size:
        return f"rank {plan.rank} is not below world_size {plan.world_size}"
    return None


def view(job: RegisteredJob, clusters: Sequence[tuple[str, str]], staged: int | None) -> Job:
    """``job`` as the API's ``Job`` record."""
    plan, beat = job.plan, job.beat
    sources = []
    read = beat.stats.replica_bytes if beat.stats else {}
    for s in plan.sources:
        # the replica it read most bytes from (staging, a cluster...), else its first
        replica = max(s.urls, key=lambda u: (read.get(u, 0), -s.urls.index(u))) if s.urls else ""
        cluster, dataset = resolve_replica(replica, clusters)
        if dataset is None:  # read from outside the clusters (staging): name the dataset by the cluster URL
            dataset = next((d for u in s.urls if (d := resolve_replica(u, clusters)[1]) is not None), None)
        sources.append(JobSource(_shown(replica), dataset, cluster, s.version, s.shuffle, s.seed))
    return Job(
        id=job.id, name=plan.name, rank=plan.rank, world_size=plan.world_size, batch_size=plan.batch_size,
        host=plan.host, pid=plan.pid, sources=sources, phases=len(plan.phases), registered_at=job.registered_at,
        last_seen=job.last_seen, position=beat.position, epoch=beat.epoch,
        samples_per_second=beat.samples_per_second, stats=beat.stats or JobStats(), staged_ahead_bytes=staged,
    )  # fmt: skip


def _shown(url: str) -> str:
    """``url`` without credentials; one that does not parse, cut short (and never matched to a cluster)."""
    try:
        return redact(url)
    except ValueError:
        return url.partition("://")[0][:16] + "://<a URL that does not parse>" if "://" in url else url[:256]


def _plain(url: str) -> str:
    """A URL compared as a location: without credentials, ``file://`` and trailing slashes."""
    out = redact(url)
    if out.startswith("file://"):
        out = out[len("file://") :]
    return out.rstrip("/")


def resolve_replica(url: str, clusters: Sequence[tuple[str, str]]) -> tuple[str | None, str | None]:
    """(cluster, dataset name) of a dataset URL that lies directly under a cluster's URL, else (None, None)."""
    try:
        where = _plain(url)
    except ValueError:  # does not parse: lies in no cluster
        return None, None
    for name, root in clusters:
        base = _plain(root)
        if where.startswith(base + "/"):
            rest = where[len(base) + 1 :]
            if rest and "/" not in rest:
                return name, rest
    return None, None
