"""Staging I/O: every ``interval``, and at once when a job registers or sends a new plan, the stager plans
(``staging_plan``) over the live jobs and carries the plan out: evicts what no job needs soon, then copies the
shards read soonest into ``[staging] url``. A job that registers while a round copies has the round plan again,
so its first shards are copied next, before the shards the other jobs read later.

A job is staged for when its plan's datasets lie in configured clusters (its loader reads
``[<staging url>/NAME, <cluster url>/NAME]``: staged shards from staging, the rest from the cluster; staging
is a partial replica). Each shard is copied from that cluster with ``copy_shard``, so it lands whole and
verified against the manifest's digest, as every replica copy. A staged copy is evicted only while the
cluster still holds the shard: staging never removes an only copy (and lies outside every cluster).
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.errors import FerryError, LeaseHeldError
from ferry.shard_tools.format.manifest import Manifest
from ferry.shard_tools.storage.store import TEMP_MARKER, Location, resolve, temp_is_stale
from ferry.shard_tools.threadname import start_named_thread

from ..config_types import Cluster, StagingConfig
from ..replication.engine import listing_with_age
from ..replication.lease import Lease
from ..transfer.transfer import copy_shard, verify_shard
from .registry import JobRegistry, RegisteredJob, plan_problem, resolve_replica
from .staging_plan import DatasetShards, JobReads, Key, SourceReads, StagingPlan, plan_staging

__all__ = ["Stager"]

log = logging.getLogger("ferry.staging")
_MANIFESTS = 64  # (cluster, dataset, version) manifests kept
_RETRY_S = 60.0  # a manifest that could not be read is tried again after this long
COPIES = 4  # shards copied into staging at a time
_REPLAN_S = 0.05  # within a round: plans again (a job registered) at most this often; polls its copies as often


@dataclass(frozen=True)
class _Origin:
    cluster: str
    dataset: str
    manifest: Manifest


class Stager:
    """Stages the registered jobs' coming shards; reports per job what is staged ahead and what is missing."""

    def __init__(self, registry: JobRegistry, config: StagingConfig, clusters: Mapping[str, Cluster]) -> None:
        self.registry, self.config, self.clusters = registry, config, dict(clusters)
        self._lock = threading.Lock()
        self._staged: dict[Key, int] = {}  # what staging holds, verified
        self._origins: dict[Key, str] = {}  # the cluster each staged shard came from
        self._report: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self._manifests: dict[tuple[str, str, str], Manifest] = {}
        self._failed: dict[tuple[str, str, str], float] = {}  # manifests that could not be read: until when
        self._adopted: set[str] = set()  # datasets whose earlier staged copies were looked for
        self._refused: set[str] = set()  # jobs whose plan no loader could have: logged once
        self._lease: Lease | None = None  # this daemon's hold on the staging location
        self.held_by_other: str | None = None  # why staging is off: another daemon stages into the location
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by a registration or a new plan (and by stop)
        self._plan_s = 0.0  # how long the last plan took
        self._thread: threading.Thread | None = None
        self.rounds = 0  # plans carried out (tests wait on it)
        registry.staging = self
        registry.on_plan = self.wake

    # the registry's StagingReport
    def staged_ahead(self, job_id: str) -> int | None:
        return self._report[0].get(job_id)

    def missing(self, job_id: str) -> int | None:
        return self._report[1].get(job_id)

    def staged(self) -> dict[Key, int]:
        with self._lock:
            return dict(self._staged)

    def start(self) -> None:
        self._thread = start_named_thread(self._run, "ferry-staging")

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def _hold(self) -> bool:
        """Whether this daemon may stage: it holds the staging location's lease (taken here, renewed by the
        lease's thread). Two daemons never stage into one location: the second stages nothing, says so once,
        and takes over when the first one's lease ends (stopped, gone, or expired)."""
        if self._lease is not None:
            if self._lease.lost is None:
                return True
            log.error("staging: lost the lease on %s (%s): staging stops until it is taken again",
                      self.config.url, self._lease.lost)  # fmt: skip
            self._lease = None
        lease = Lease(self._location(self.config.url, None), "staging")
        try:
            lease.acquire()
        except LeaseHeldError as exc:
            if self.held_by_other != str(exc):
                log.error("staging: off: another daemon stages into this location: %s", exc)
                self.held_by_other = str(exc)
            return False
        except FerryError as exc:  # e.g. a lease file that is not one: said once, tried again every round
            if self.held_by_other != str(exc):
                log.error("staging: off: cannot take the lease on %s: %s", self.config.url, exc)
                self.held_by_other = str(exc)
            return False
        lease.keep()
        self._lease, self.held_by_other = lease, None
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 — staging is an optimisation: it never takes the daemon down
                log.exception("staging round failed")
            self._stop.wait(self._gap())  # registrations in a stream: the stager plans at most half the time
            self._wake.wait(self.config.interval)

    def wake(self) -> None:
        """A job registered or re-planned: plan again now (between two rounds, or within one) rather than after
        ``interval``, so that its first shards are staged before it reads them."""
        self._wake.set()

    def step(self) -> StagingPlan:
        """One round: plan over the live jobs, evict, stage (soonest read first, until stopped). A job that
        registers meanwhile has the round plan again: its first shards go before the others' later ones."""
        self._wake.clear()
        if not self._hold():
            self._report = ({}, {})
            self.rounds += 1
            return StagingPlan()
        plan, origins = self._plan()
        # COPIES at a time, started soonest read first: a remote cluster's round trip and per-connection rate
        # do not bound staging to one shard at a time
        queue = deque(plan.stage)
        flying: dict[Future[None], Key] = {}
        sizes = dict(plan.hold)  # bytes of each shard planned (a plan made meanwhile counts those in flight)
        unheld: set[Key] = set()  # copies in flight that the latest plan leaves out: evicted once they land
        planned = time.monotonic()
        with ThreadPoolExecutor(COPIES, thread_name_prefix="ferry-staging-copy") as pool:
            while not self._stop.is_set():  # bounded: each pass starts or ends a copy, or plans again
                while queue and len(flying) < COPIES:
                    key = queue.popleft()
                    origin = origins.get(key[0])
                    if origin is not None and key not in flying.values():
                        flying[pool.submit(self._copy, key, origin)] = key
                if not flying:
                    break
                done, _ = wait(flying, timeout=_REPLAN_S, return_when=FIRST_COMPLETED)
                for copy in done:
                    flying.pop(copy)
                    if not copy.cancelled() and copy.exception() is not None:
                        log.error("staging: a copy failed", exc_info=copy.exception())
                if self._wake.is_set() and time.monotonic() - planned >= self._gap():
                    self._wake.clear()
                    plan, origins = self._plan({k: sizes[k] for k in flying.values()})
                    sizes.update(plan.hold)
                    unheld = {k for k in flying.values() if k not in plan.hold}
                    planned = time.monotonic()
                    queue = deque(plan.stage)
        for key in sorted(unheld & self.staged().keys()):  # staging holds no more than the budget once done
            self._evict(key)
        with self._lock:
            staged = dict(self._staged)
        self._report = (plan.staged_ahead(staged), plan.missing(staged))
        self.rounds += 1
        return plan

    def _gap(self) -> float:
        """The least time between two plans: ``_REPLAN_S``, or as long as the last plan took."""
        return max(_REPLAN_S, self._plan_s)

    def _plan(self, flying: Mapping[Key, int] | None = None) -> tuple[StagingPlan, dict[str, _Origin]]:
        """Plan over the live jobs and evict what the plan leaves out; the plan and where each dataset comes from.
        ``flying``: the copies in flight (key: bytes), planned for as staged (and evicted, if left out, once done)."""
        t0 = time.monotonic()
        reads, origins = self._reads(self.registry.live())
        with self._lock:
            staged = dict(self._staged)
        staged.update(flying or {})
        plan = plan_staging(reads, staged, horizon=self.config.horizon, budget=self.config.budget)
        self._plan_s = time.monotonic() - t0
        for key in plan.evict:
            if not flying or key not in flying:
                self._evict(key)
        with self._lock:
            staged = dict(self._staged)
        self._report = (plan.staged_ahead(staged), plan.missing(staged))
        return plan, origins

    def _reads(self, jobs: list[RegisteredJob]) -> tuple[list[JobReads], dict[str, _Origin]]:
        """Each job's plan resolved against the clusters and their manifests (sources elsewhere: None), and
        where each dataset's shards come from."""
        out: list[JobReads] = []
        origins: dict[str, _Origin] = {}
        for job in jobs:
            problem = plan_problem(job.plan)
            if problem is not None:
                if job.id not in self._refused:
                    self._refused.add(job.id)
                    log.warning("staging: not for job %s (%s): %s", job.id, job.plan.name, problem)
                continue
            sources: list[SourceReads | None] = []
            for src in job.plan.sources:
                origin = self._origin(src.urls, src.version)
                if origin is None:
                    sources.append(None)
                    continue
                if origin.dataset not in self._adopted:
                    self._adopt(origin)
                origins.setdefault(origin.dataset, origin)
                t = origin.manifest.shards
                shards = DatasetShards(origin.dataset, t.paths, np.asarray(t.stored_bytes), t.token_offsets,
                                       np.asarray(t.documents))  # fmt: skip
                era_start = sum(e.samples * e.epochs for e in src.eras)
                seed = int(src.seed) % 2**64  # the loader's seeds are below 2**64 (the pattern allows 20 digits)
                sources.append(SourceReads(shards, seed, src.shuffle, src.window, src.mode, src.seq_len, era_start))
            phases = [(p.start, p.quota) for p in job.plan.phases]
            out.append(JobReads(job.id, job.beat.position, phases, sources))
        return out, origins

    def _origin(self, urls: list[str], version: str) -> _Origin | None:
        """The first of ``urls`` that names a dataset of a configured cluster, with that version's manifest."""
        clusters = [(c.name, c.url) for c in self.clusters.values()]
        for url in urls:
            cluster, dataset = resolve_replica(url, clusters)
            if cluster is not None and dataset is not None:
                manifest = self._manifest(cluster, dataset, version)
                return None if manifest is None else _Origin(cluster, dataset, manifest)
        return None

    def _manifest(self, cluster: str, dataset: str, version: str) -> Manifest | None:
        key = (cluster, dataset, version)
        found = self._manifests.get(key)
        if found is None:
            if time.monotonic() < self._failed.get(key, 0.0):
                return None  # it failed a moment ago: no read (and no log line) every round
            try:
                found = load_manifest(self._location(self.clusters[cluster].dataset_url(dataset), cluster), version)
            except FerryError as exc:
                log.warning("staging: cannot read %s version %s at %s (trying again in %.0f s): %s",
                            dataset, version, cluster, _RETRY_S, exc)  # fmt: skip
                self._failed[key] = time.monotonic() + _RETRY_S
                if len(self._failed) > 4 * _MANIFESTS:
                    self._failed.clear()
                return None
            if len(self._manifests) >= _MANIFESTS:
                self._manifests.pop(next(iter(self._manifests)))
            self._manifests[key] = found
        return found

    def _location(self, url: str, cluster: str | None) -> Location:
        options = self.clusters[cluster].storage_options if cluster else self.config.storage_options
        return resolve(url, options)

    def _adopt(self, origin: _Origin) -> None:
        """Count the shards a previous run of the daemon staged for ``origin.dataset`` that still verify (so
        they count against the budget and can be evicted); a copy that does not verify is removed, and so is
        a temp file whose writer is gone (a copy cut short: the daemon was killed while it staged)."""
        self._adopted.add(origin.dataset)
        dst = self._location(self.config.dataset_url(origin.dataset), None)
        table = origin.manifest.shards
        wanted = {p: i for i, p in enumerate(table.paths)}
        try:
            held = listing_with_age(dst)
        except FerryError as exc:
            log.warning("staging: cannot list %s in staging: %s", origin.dataset, exc)
            return
        for path, (_size, age) in sorted(held.items()):
            if posixpath.basename(path).startswith(TEMP_MARKER):
                if temp_is_stale(path, age):
                    log.info("staging: removing the leftover temp file %s/%s", origin.dataset, path)
                    with contextlib.suppress(FerryError):
                        dst.remove(path)
                continue
            i = wanted.get(path)
            if i is None:
                continue
            info = table[i]
            try:
                problem = verify_shard(dst, path, info.stored_bytes, info.stored_digest)
                if problem is not None:
                    log.warning("staging: removing %s/%s from staging: %s", origin.dataset, path, problem)
                    dst.remove(path)
                    continue
            except FerryError as exc:
                log.warning("staging: cannot check %s/%s: %s", origin.dataset, path, exc)
                continue
            with self._lock:
                self._staged[(origin.dataset, path)] = info.stored_bytes
                self._origins[(origin.dataset, path)] = origin.cluster

    def _copy(self, key: Key, origin: _Origin) -> None:
        if self._stop.is_set():  # stopping: the copies not started yet are not made
            return
        dataset, path = key
        info = origin.manifest.shards[origin.manifest.shards.paths.index(path)]
        src = self._location(self.clusters[origin.cluster].dataset_url(dataset), origin.cluster)
        dst = self._location(self.config.dataset_url(dataset), None)
        try:
            copy_shard(src, dst, path, info.stored_bytes, info.stored_digest)
        except FerryError as exc:
            log.warning("staging: cannot stage %s/%s from %s: %s", dataset, path, origin.cluster, exc)
            return
        with self._lock:
            self._staged[key] = info.stored_bytes
            self._origins[key] = origin.cluster

    def _evict(self, key: Key) -> None:
        dataset, path = key
        cluster = self._origins.get(key)
        try:
            if cluster is None or not self._location(self.clusters[cluster].dataset_url(dataset), cluster).exists(path):
                log.warning("staging: keeping %s/%s: its cluster copy is gone (staging may hold the only one)",
                            dataset, path)  # fmt: skip
                return
            self._location(self.config.dataset_url(dataset), None).remove(path)
        except FerryError as exc:
            log.warning("staging: cannot evict %s/%s: %s", dataset, path, exc)
            return
        with self._lock:
            self._staged.pop(key, None)
            self._origins.pop(key, None)
