"""One sync pass of one dataset to one destination: plan → execute → publish → retire.

The pass reads the source's and the destination's ``manifest.json`` first; when both name
the same version it stops there (an unchanged dataset costs exactly those two reads).
Otherwise it loads the source's shard table, lists the destination's dataset prefix,
plans, copies, and publishes ``versions/<id>.json`` then ``manifest.json`` at the
destination only when every shard of the version is verified there. Retention runs after
a publish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.compute as pc

from ferry.shard_tools.errors import DatasetNotFoundError, LeaseHeldError, ManifestError, RollbackError, StorageError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.header import MANIFEST_FILE, SHARDS_DIR, VERSIONS_DIR, parse_header, version_path
from ferry.shard_tools.storage.publish import carry_lineage, descends_from, store_version, swap_manifest
from ferry.shard_tools.storage.store import STALE_TEMP_SECONDS, TEMP_MARKER, Location, temp_is_stale

from ..config import link_name
from ..config_types import LinkSpec, SwarmConfig
from ..events import EventBus
from ..transfer.executor import Executor, Job, JobResult
from ..transfer.object_store import abort_stale_uploads
from ..transfer.stats import Stats
from .columns import bools, int64s, positions, release_memory
from .lease import DEFAULT_TTL, Lease
from .passes import PassResult
from .planner import (
    MISSING,
    REASONS,
    ColumnPlan,
    SourceColumns,
    SourcePicker,
    SourceVersion,
    VersionRecord,
    order_sources,
    plan_columns,
    plan_retention,
)
from .routes import RouteError
from .state import State
from .swarm_fill import SwarmFill, fillers
from .swarm_plan import origin_order
from .swarm_routes import planned_rates, route_rows
from .swarm_set import Advertiser, clear_swarm

if TYPE_CHECKING:
    from ferry.shard_tools.format.manifest import StoredShards

__all__ = ["Engine", "PassResult", "read_header", "load_version", "listing", "HEAD_MIN_SHARDS", "HEAD_SHARE",
           "JOB_BATCH"]  # fmt: skip

log = logging.getLogger("ferry.daemon")
#: the subject of the open error a routed swarm reports when it has no plan
ROUTES_PROBLEM = "(swarm routes)"

#: A version of at least HEAD_MIN_SHARDS shards of which at most one in HEAD_SHARE is not known verified at
#: a destination that publishes a version has only those looked up there (HEAD_THREADS at a time), not the
#: whole dataset listed.
HEAD_MIN_SHARDS = 4096
HEAD_SHARE = 32
HEAD_THREADS = 32
#: verified shards looked up with them, at random: one missing or changed and the pass lists the destination
HEAD_SAMPLE = 64
#: shards whose jobs a pass hands the executor at a time
JOB_BATCH = 4096


def read_header(loc: Location, rel: str = MANIFEST_FILE) -> tuple[bytes, dict[str, Any]] | None:
    """The raw bytes and parsed header of ``rel`` (None where it does not exist)."""
    try:
        data = loc.read_bytes(rel)
    except FileNotFoundError:
        return None
    return data, parse_header(data)


def load_version(loc: Location, header: bytes) -> StoredShards:
    """The version whose header is ``header`` with the stored-shard columns of its table read from ``loc``
    (paths, stored sizes and digests: what a replica copies and checks; the other columns stay undecoded).
    The table's bytes are not kept: a pass that publishes reads them again."""
    from ferry.shard_tools.format.manifest import StoredShards  # numpy + pyarrow: only when there is work to plan

    doc = parse_header(header)
    try:
        table = loc.read_bytes(doc["shard_table"]["path"])
    except FileNotFoundError as exc:
        raise ManifestError(f"shard table {doc['shard_table']['path']} is missing at {loc.url}") from exc
    version = StoredShards.from_json(header, table)
    del table
    release_memory()  # the table's bytes and the IPC reader's copies of its body: freed, returned now
    return version


def listing(loc: Location) -> dict[str, int]:
    """Every object under the dataset prefix (relative path → size): one recursive listing."""
    return {rel: size for rel, (size, _) in listing_with_age(loc).items()}


def listing_with_age(loc: Location) -> dict[str, tuple[int, float | None]]:
    """Every object under the dataset prefix: relative path → (size, seconds since it last
    changed, None where the store does not say). One recursive listing."""
    loc.fs.invalidate_cache(loc.root)  # another process may have written since (s3fs caches listings)
    try:
        found = loc.fs.find(loc.root, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"cannot list {loc.url}: {exc}") from exc
    prefix = loc.root.rstrip("/") + "/"
    now = time.time()
    out: dict[str, tuple[int, float | None]] = {}
    for name, info in found.items():
        if info.get("type", "file") != "file":
            continue
        name = str(name)
        rel = name[len(prefix) :] if name.startswith(prefix) else name.lstrip("/")
        out[rel] = (int(info.get("size") or 0), _age(info, now))
    return out


def _age(info: Mapping[str, Any], now: float) -> float | None:
    changed = info.get("mtime", info.get("LastModified"))
    if hasattr(changed, "timestamp"):
        changed = changed.timestamp()
    return now - float(changed) if isinstance(changed, (int, float)) else None


def _publishes(loc: Location, version: str) -> bool:
    """Whether ``loc``'s manifest.json names ``version`` (then every shard of it is verified there)."""
    try:
        header = read_header(loc)
    except (StorageError, ManifestError):
        return False
    return header is not None and header[1]["version_id"] == version


def _created_ts(header: dict[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(header["created_at"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return None


class Engine:
    """Runs passes with a shared executor, state, stats and event bus."""

    def __init__(
        self,
        executor: Executor,
        state: State,
        *,
        events: EventBus | None = None,
        keep_versions: int | None = None,
        priority: Mapping[str, int] | None = None,
        writer: str = "daemon",
        lease_ttl: float = DEFAULT_TTL,
        allow_rollback: bool = False,
        swarm: SwarmConfig | None = None,
        links: Sequence[LinkSpec] = (),
    ) -> None:
        """``writer`` names this kind of writer in the destination's lease (daemon, sync);
        ``allow_rollback`` lets a pass publish a version that does not descend from the
        destination's current one (the user forces it); ``swarm`` (enabled) makes a pass offer its
        verified shards to the other clusters filling the version and pull from them (see ``swarm_fill``);
        ``links``: the fleet's ``[[links]]``, which a routed swarm plans over."""
        self.executor = executor
        self.writer = writer
        self.lease_ttl = lease_ttl
        self.allow_rollback = allow_rollback
        self.state = state
        self.stats: Stats = executor.stats
        self.events = events or EventBus()
        self.keep_versions = keep_versions
        self.priority = dict(priority or {})
        self.swarm = swarm if swarm is not None and swarm.enabled else None
        self.links = tuple(links)
        self.planned: dict[tuple[str, str], float] = {}  # (src, dst) → bytes/s, of the last routed plan here

    def _history(self, job: Job, src: str, nbytes: int, started: float, duration: float, error: str | None) -> None:
        self.state.record_transfer(
            job.dataset, job.version, job.shard.path, src, job.dest, nbytes, started, duration, error is None, error
        )

    def _event(self, type_: str, **fields: Any) -> None:
        self.events.publish(type_, **fields)

    def sync_pass(
        self,
        dataset: str,
        source: str,
        dest: str,
        locations: Mapping[str, Location],
        *,
        src_header: tuple[bytes, dict[str, Any]] | None = None,
        on_plan: Callable[[PassResult], None] | None = None,
    ) -> PassResult:
        """Bring ``dest`` to the source's current version. ``locations`` maps cluster names to the
        dataset's location on each (the source, the destination and any other replica).
        ``on_plan`` receives the result object once planned; it fills in while shards complete.

        Raises RollbackError (before copying anything) when the source's version does not
        descend from the destination's, and LeaseHeldError when another writer holds the
        destination's lease."""
        t0 = time.monotonic()
        src_loc, dst_loc = locations[source], locations[dest]
        if src_header is None:
            src_header = read_header(src_loc)
        if src_header is None:
            raise DatasetNotFoundError(f"no {MANIFEST_FILE} at {src_loc.url}: nothing to replicate")
        result = PassResult.of_source(dataset, source, dest, src_header[1])
        try:
            dst_header = read_header(dst_loc)
        except ManifestError:
            dst_header = None  # a damaged manifest.json at the destination is simply published again
        dest_version = str(dst_header[1]["version_id"]) if dst_header else None
        if dest_version == result.version_id:
            self._up_to_date(result, on_plan)
        else:
            self._check_descends(src_loc, dst_loc, result.version_id, dest_version)
            with Lease(dst_loc, self.writer, ttl=self.lease_ttl) as lease:
                self._bring_up(result, src_header[0], src_loc, dst_loc, dest_version, locations, on_plan, lease)
        result.seconds = time.monotonic() - t0
        if not result.up_to_date:
            self._event(
                "pass", dataset=dataset, source=source, destination=dest, copied=result.copied,
                failed=len(result.failed), published=result.published,
            )  # fmt: skip
        return result

    def _up_to_date(self, result: PassResult, on_plan: Callable[[PassResult], None] | None) -> None:
        result.mark_up_to_date()
        if on_plan is not None:
            on_plan(result)
        self.stats.set_pending(result.dataset, result.destination, 0, 0)

    def _check_descends(self, src: Location, dst: Location, version: str, dest_version: str | None) -> None:
        """Refuse to replace ``dest_version`` by a ``version`` that is not its descendant."""
        if dest_version is None or self.allow_rollback:
            return
        ok, why = descends_from([src, dst], version, dest_version)
        if not ok:
            raise RollbackError(
                f"refusing to publish {version} at {dst.url}: it would replace {dest_version}, which it does not "
                f"descend from ({why}); the destination stays as it is (force with --allow-rollback)"
            )

    def _bring_up(
        self,
        result: PassResult,
        src_bytes: bytes,
        src_loc: Location,
        dst_loc: Location,
        dest_version: str | None,
        locations: Mapping[str, Location],
        on_plan: Callable[[PassResult], None] | None,
        lease: Lease,
    ) -> None:
        """Plan, copy and publish one version at a destination whose lease this writer holds; once the
        lease is lost (taken over, broken) no further copy starts and nothing is published."""
        dataset, source, dest, version = result.dataset, result.source, result.destination, result.version_id
        now, created = time.time(), _created_ts(parse_header(src_bytes))
        self.state.seen_version(dataset, dest, version, min(now, created) if created else now)
        manifest = load_version(src_loc, src_bytes)  # its table's bytes are read again to publish it
        cols = SourceColumns.of(manifest)
        work, ages = self._plan(result, cols, dst_loc, dest_version)
        release_memory()  # planning's hash tables, masks and sets: back to the system now
        if on_plan is not None:
            on_plan(result)
        if len(work.rows):
            holders = self._holders(cols, dataset, source, dest, locations)
            pick = SourcePicker(source, self.priority, holders)
            if self.swarm is not None:
                self._copy_swarm(work, cols, pick, result, dst_loc, locations, lease, manifest.table_digest)
            else:
                self._copy(work, cols, pick, result, dst_loc, locations, lease)
        if lease.lost is not None:
            raise LeaseHeldError(
                f"{dst_loc.url}: lost the writer lease while copying ({lease.lost}); stopped copying into it, "
                "nothing published (the next pass takes the lease again if it is free)",
                holder=lease.lost_to,
                retryable=True,
            )
        if result.ok:
            self._publish(src_loc, dst_loc, manifest, src_bytes, result)
            if self.keep_versions and result.published:
                self._retain(dst_loc, manifest, dataset, dest, ages, result)

    def _plan(
        self, result: PassResult, cols: SourceColumns, dst: Location, dest_version: str | None
    ) -> tuple[_Work, dict[str, tuple[int, float | None]] | None]:
        """Plan the pass (and delete the stale temp files the plan names): its work, and the destination's
        listing where it was listed. The plan's own arrays (masks, the sizes held there, the verified rows)
        are gone once it returns."""
        dataset, dest = result.dataset, result.destination
        verified = cols.has(self.state.verified_paths(dataset, dest))
        release_memory()  # the verified set's paths, decoded to compare: back to the system before planning
        held = self._held(dst, cols, verified, dest_version)
        plan = plan_columns(
            cols,
            dest_version=dest_version,
            held_sizes=held.sizes,
            verified=verified,
            bad=cols.has(self.state.bad(dataset, dest)),
            temps=held.ages or (),
        )
        self._delete_temps(plan, held, dst, result)
        result.already_verified = len(plan.verified_rows)
        result.verified_bytes = int(cols.sizes[plan.verified_rows].sum())
        work = _Work.of(plan, cols, self.state.fatal(dataset, dest), _unreplaceable(plan, cols, dst))
        result.skipped_failed = len(plan.copy_rows) + len(plan.verify_rows) - len(work.rows)
        self.stats.set_pending(dataset, dest, int(cols.sizes[work.rows].sum()), len(work.rows))
        return work, held.ages

    def _held(self, dst: Location, cols: SourceColumns, verified: np.ndarray, dest_version: str | None) -> _Held:
        """What the destination holds of the version. A version that adds a few shards to a large dataset the
        destination publishes has only its unverified shards looked up, in parallel (one HEAD each on an
        object store), with a random sample of the verified ones: a shard verified there before is taken to
        be there while every sampled one is. Otherwise one recursive listing, which also finds the temp
        files to clean up."""
        unverified = np.flatnonzero(~verified)
        few = len(cols) >= HEAD_MIN_SHARDS and len(unverified) * HEAD_SHARE <= len(cols)
        if few and dest_version is not None:
            known = np.flatnonzero(verified)
            sample = np.random.default_rng().choice(known, min(HEAD_SAMPLE, len(known)), replace=False)
            rows = np.concatenate([unverified, sample])
            paths = cols.paths.take(int64s(rows)).to_pylist()
            found = np.fromiter(_sizes(dst, paths), np.int64, len(rows))
            if np.array_equal(found[len(unverified) :], cols.sizes[sample]):
                sizes = cols.sizes.copy()
                sizes[unverified] = found[: len(unverified)]
                return _Held(sizes, None)
        ages = listing_with_age(dst)  # a verified shard is gone or changed: nothing is taken on trust
        return _Held(cols.held_sizes({p: size for p, (size, _) in ages.items()}), ages)

    def _delete_temps(self, plan: ColumnPlan, held: _Held, dst: Location, result: PassResult) -> None:
        for tmp in plan.delete_temps:
            if held.ages is None or not temp_is_stale(tmp.path, held.ages[tmp.path][1]):
                continue  # a live writer's (a pack on this host, or recent: another host's)
            with contextlib.suppress(StorageError):
                dst.remove(tmp.path)
                result.temps_deleted += 1
        with contextlib.suppress(StorageError):
            result.temps_deleted += abort_stale_uploads(dst)

    def _holders(
        self, cols: SourceColumns, dataset: str, source: str, dest: str, locations: Mapping[str, Location]
    ) -> dict[str, np.ndarray]:
        """cluster → the rows it holds a verified copy of, for every cluster but the source and ``dest``."""
        holders = {
            c: cols.has(self.state.verified_paths(dataset, c))
            for c in self.state.verified_clusters(dataset)
            if c not in (source, dest) and c in locations
        }
        for c in locations:  # published by another cluster's daemon (pull model: nothing shared but storage)
            if c not in (source, dest) and _publishes(locations[c], cols.version_id):
                holders[c] = np.ones(len(cols), dtype=bool)
        return {c: held for c, held in holders.items() if held.any()}

    def _copy(
        self,
        work: _Work,
        cols: SourceColumns,
        pick: SourcePicker,
        result: PassResult,
        dst: Location,
        locations: Mapping[str, Location],
        lease: Lease,
        on_ok: Callable[[JobResult], None] | None = None,
    ) -> None:
        """Run the work ``JOB_BATCH`` shards at a time (the jobs of one batch at a time in memory)."""
        stop = lambda: lease.lost is not None  # noqa: E731
        for start in range(0, len(work.rows), JOB_BATCH):
            if stop() or result.cancelled:
                break
            jobs, guarded = work.jobs(cols, pick, result, start, start + JOB_BATCH)
            done = functools.partial(self._on_kept, guarded=guarded, dst=dst, result=result, on_ok=on_ok)
            self.executor.run(jobs, locations, done, self._history, stop=stop)
        self.state.flush()  # the pass's verified marks are committed before its manifest is published

    def _copy_swarm(
        self,
        work: _Work,
        cols: SourceColumns,
        pick: SourcePicker,
        result: PassResult,
        dst: Location,
        locations: Mapping[str, Location],
        lease: Lease,
        table_digest: str,
    ) -> None:
        """The pass's copies as a swarm (``[swarm] enabled``): shards checked in place or guarded first, as
        usual; then every missing one from whichever cluster holds it verified (``swarm_fill``), while this
        cluster's verified set of the version stays readable by its peers at ``swarm/<version>.json``."""
        assert self.swarm is not None
        version, source, dest = result.version_id, result.source, result.destination
        verified = np.ones(len(cols), dtype=bool)
        verified[work.open_rows] = False
        plain = ~work.verify_first & ~work.guarded & ~work.replace
        interval = self.swarm.interval
        with Advertiser(dst, version, table_digest, verified, interval=interval,
                        heartbeat=max(interval, self.swarm.stale_after / 3),
                        writable=lambda: lease.lost is None) as advert:  # fmt: skip
            rest = work.subset(~plain)
            if len(rest.rows):
                row_of = dict(zip(cols.paths.take(int64s(rest.rows)).to_pylist(), rest.rows.tolist(), strict=True))
                self._copy(rest, cols, pick, result, dst, locations, lease,
                           on_ok=lambda r: advert.finished(row_of[r.job.shard.path], True))  # fmt: skip
            rows = work.rows[plain]
            if not len(rows) or lease.lost is not None or result.cancelled:
                self.state.flush()
                return
            who = fillers(dest, source, locations, version)
            peers = [c for c in locations if c not in (source, dest)]
            fill = SwarmFill(self.swarm, self.executor, version, table_digest, len(cols), source, dest, peers,
                             order=origin_order(rows, who, dest), static=pick.holders, priority=self.priority,
                             routes=self._routes(cols, rows, source, who, locations, result))  # fmt: skip

            def make_job(row: int, sources: tuple[str, ...]) -> Job:
                return Job(result.dataset, version, cols.refs(np.array([row]))[0], sources, dest)

            fill.run(rows, advert, locations, make_job, functools.partial(self._on_result, result=result),
                     self._history, stop=lambda: lease.lost is not None)  # fmt: skip
            self.state.flush()

    def _routes(
        self,
        cols: SourceColumns,
        rows: np.ndarray,
        source: str,
        who: Sequence[str],
        locations: Mapping[str, Location],
        result: PassResult,
    ) -> dict[str, np.ndarray] | None:
        """``[swarm] routed``: the source of each row, from the route planner over the ``[[links]]`` (a link
        without a capacity takes its ``[limits.per_link]`` rate); None without routes, or when no route
        plan exists (an event says why, and the fill balances load instead)."""
        assert self.swarm is not None
        if not self.swarm.routed:
            return None
        holders = [source, *(c for c in locations if c != source and c not in who)]
        bw = self.executor.bandwidth
        specs = [
            ln if ln.capacity is not None else dataclasses.replace(ln, capacity=bw.limit_of(link_name(ln.src, ln.dst)))
            for ln in self.links
        ]
        dest = result.destination
        try:
            routed = route_rows(cols.sizes, rows, holders, who, dest, specs, self.swarm.budget)
        except RouteError as exc:
            reason = f"swarm routes for {result.dataset} {result.version_id}: {exc}; balancing load instead"
            log.warning("%s", reason)
            error_id = self.state.open_problem(result.dataset, dest, ROUTES_PROBLEM, reason, retryable=False)
            self._event("error", id=error_id, dataset=result.dataset, version=result.version_id, cluster=dest,
                        shard=ROUTES_PROBLEM, reason=reason, retryable=False, attempts=1)  # fmt: skip
            return None
        self.state.clear_problem(result.dataset, dest, ROUTES_PROBLEM)
        self.planned = {**{k: v for k, v in self.planned.items() if k[1] != dest}, **planned_rates(routed.plan)}
        log.info("swarm routes for %s %s into %s: rows by source %s, predicted fill %.3g s, $%.3g",
                 result.dataset, result.version_id, dest, {s: int(m.sum()) for s, m in routed.sources.items()},
                 routed.plan.fill_s, routed.plan.cost)  # fmt: skip
        return routed.sources

    def _on_kept(
        self,
        r: JobResult,
        *,
        guarded: set[str],
        dst: Location,
        result: PassResult,
        on_ok: Callable[[JobResult], None] | None,
    ) -> None:
        self._on_result(_kept(r, guarded, dst), result)
        if on_ok is not None and r.ok:
            on_ok(r)

    def _on_result(self, r: JobResult, result: PassResult) -> None:
        job = r.job
        result.corrupt_detected += r.corrupt
        if r.cancelled:
            result.cancelled = True
            return
        self.stats.add_pending(job.dataset, job.dest, -job.shard.size, -1)
        if r.ok:
            self.state.shard_verified(job.dataset, job.version, job.dest, job.shard.path, attempts=r.attempts,
                                      size=job.shard.size)  # fmt: skip
            result.verified_bytes += job.shard.size
            if r.copied:
                result.copied += 1
                result.copied_bytes += r.bytes
            else:
                result.verified_in_place += 1
            self._event(
                "shard_verified", dataset=job.dataset, version=job.version, shard=job.shard.path,
                source=r.src or job.dest, destination=job.dest, bytes=r.bytes, duration_s=r.seconds,
            )  # fmt: skip
        else:
            result.failed.append(r)
            error_id = self.state.mark(job.dataset, job.version, job.dest, job.shard.path, "failed",
                                       error=r.error, retryable=r.retryable, attempts=r.attempts,
                                       size=job.shard.size)  # fmt: skip
            self._event(
                "error", id=error_id, dataset=job.dataset, version=job.version, cluster=job.dest,
                shard=job.shard.path, reason=r.error or "failed", retryable=r.retryable, attempts=r.attempts,
            )  # fmt: skip

    def _publish(self, src: Location, dst: Location, manifest: StoredShards, header: bytes, res: PassResult) -> None:
        """The shard table, versions/<id>.json, then manifest.json by compare-and-swap: only over an ancestor
        (or nothing), so a slower writer of an older version can never roll the destination back. The
        table's bytes are read from the source again here: a pass copying for hours does not hold them."""
        try:
            table = src.read_bytes(manifest.table_path)
        except FileNotFoundError as exc:
            raise ManifestError(f"shard table {manifest.table_path} is gone from {src.url}") from exc
        if digest_bytes(table) != manifest.table_digest:
            raise ManifestError(f"shard table {manifest.table_path} at {src.url} does not match its digest")
        store_version(dst, manifest, table, header)
        version = manifest.version_id

        def choose(doc: dict[str, Any] | None) -> bytes | None:
            now = None if doc is None else str(doc["version_id"])
            if now == version:
                return None  # another writer published the same version meanwhile
            self._check_descends(src, dst, version, now)
            carry_lineage([src], dst, version, now)  # the records between: ancestry stays answerable here
            return header

        swap_manifest(dst, choose)
        res.published = True
        if self.swarm is not None:
            clear_swarm(dst)  # peers now see the version published; the verified set has served
        self.state.verified_version(res.dataset, res.destination, SourceColumns.of(manifest).paths)
        self.state.completed_version(res.dataset, res.destination, version)
        self._event("version_published", dataset=res.dataset, version=version, cluster=res.destination)

    def _retain(
        self,
        dst: Location,
        current: StoredShards,
        dataset: str,
        dest: str,
        held: Mapping[str, tuple[int, float | None]] | None,
        res: PassResult,
    ) -> None:
        """Retire versions and delete shards beyond ``keep_versions``; ``held`` is the pass's listing of
        ``dst`` (None: the pass looked up only new shards, so this lists it now)."""
        assert self.keep_versions
        if held is None:
            held = listing_with_age(dst)
        ids = [n[: -len(".json")] for n in dst.listdir(VERSIONS_DIR) if n.endswith(".json")]
        records = []
        for vid in ids:
            if vid == current.version_id:
                m = current
            else:
                got = read_header(dst, version_path(vid))
                if got is None:
                    continue
                try:
                    m = load_version(dst, got[0])
                except (ManifestError, StorageError):
                    continue  # an unreadable old version is left alone
            generation = int(m.lineage["gen"]) if m.lineage else 0
            records.append(VersionRecord(vid, m.created_at, frozenset(m.paths.to_pylist()), m.table_path, generation))
        named = set().union(*(r.paths for r in records)) if records else set()
        # a shard no version names may be a concurrent `ferry pack --append`'s, stored but not yet
        # published: an orphan is one this service put there, or one unchanged for STALE_TEMP_SECONDS
        ours = set(self.state.verified(dataset, dest))
        orphans = {
            p
            for p, (_, age) in held.items()
            if p.startswith(f"{SHARDS_DIR}/")
            and TEMP_MARKER not in p
            and (p in ours or age is None or age >= STALE_TEMP_SECONDS)
        } - named
        if len(records) <= self.keep_versions and not orphans:
            return
        src_paths = set(current.paths.to_pylist())
        replicas = self.state.replicas(dataset)
        elsewhere = {p: len([c for c in replicas.get(p, []) if c != dest]) + (p in src_paths) for p in named | orphans}
        plan = plan_retention(records, current=current.version_id, keep_versions=self.keep_versions,
                              copies_elsewhere=elsewhere, orphans=orphans)  # fmt: skip
        for vid in plan.retire:
            dst.remove(version_path(vid))
        for path in plan.delete_shards + plan.delete_tables:
            dst.remove(path)
        self.state.forget(dataset, dest, plan.delete_shards)
        res.retired, res.deleted_shards, res.protected_shards = plan.retire, plan.delete_shards, plan.protected

    def scrub(self, dataset: str, cluster: str, locations: Mapping[str, Location]) -> tuple[int, list[str], list[str]]:
        """Re-hash every shard ``cluster`` publishes; repair bad ones from the other clusters.
        Returns (checked, bad, repaired)."""
        loc = locations[cluster]
        got = read_header(loc)
        if got is None:
            return 0, [], []
        manifest = load_version(loc, got[0])
        others = order_sources([c for c in locations if c != cluster], self.priority)
        jobs = [
            Job(dataset, manifest.version_id, s, others, cluster, verify_first=True, replace=True)
            for s in SourceVersion.of(manifest).shards
        ]  # a scrub hashes every shard: one job each
        bad: list[str] = []
        repaired: list[str] = []
        intact: list[str] = []  # verified, recorded JOB_BATCH at a time (one row each in the state)
        lock = threading.Lock()

        def done(r: JobResult) -> None:
            path = r.job.shard.path
            if r.corrupt or r.copied:
                bad.append(path)
                if r.ok:
                    repaired.append(path)
                else:
                    self.state.mark_bad(dataset, cluster, path, r.error or "corrupt")
            if r.ok:
                with lock:
                    intact.append(path)
                    full = intact[:] if len(intact) >= JOB_BATCH else []
                    if full:
                        intact.clear()
                self.state.add_verified(dataset, cluster, full)

        self.executor.run(jobs, locations, done, self._history)
        self.state.add_verified(dataset, cluster, intact)
        return len(jobs), sorted(bad), sorted(repaired)


@dataclass(frozen=True)
class _Held:
    """What a destination holds of a version: each row's size there (``MISSING``: none), and the listing
    with ages (path → (size, seconds since it changed)) where one was made."""

    sizes: np.ndarray
    ages: dict[str, tuple[int, float | None]] | None


@dataclass(frozen=True)
class _Work:
    """The rows a pass copies or verifies (less shards failed for good), in plan order, each with how."""

    rows: np.ndarray
    verify_first: np.ndarray  # bool per entry of rows: the destination holds it, hash before copying
    replace: np.ndarray  # bool: a copy may replace the object at the shard's path
    guarded: np.ndarray  # bool: the object there may not be replaced, only verified (no sources)
    open_rows: np.ndarray  # every row the plan copies or verifies (those failed for good included)

    @classmethod
    def of(cls, plan: ColumnPlan, cols: SourceColumns, fatal: set[str], guarded: np.ndarray) -> _Work:
        rows = np.concatenate([plan.copy_rows, plan.verify_rows])
        copying = np.arange(len(rows)) < len(plan.copy_rows)
        # an object standing at a path that is not guarded is a damaged copy of what the destination's current
        # version names: the one case a copy replaces it (a repair); every other copy only creates the object
        replace = np.concatenate([plan.copy_reasons != REASONS.index("missing"), np.ones(len(plan.verify_rows), bool)])
        keep = ~cols.has(fatal)[rows] if fatal else np.ones(len(rows), dtype=bool)
        at_risk = guarded[rows]
        return cls(rows[keep], (~copying | at_risk)[keep], (replace & ~at_risk)[keep], at_risk[keep], rows)

    def subset(self, mask: np.ndarray) -> _Work:
        """The entries ``mask`` marks (a bool per entry of ``rows``)."""
        return _Work(self.rows[mask], self.verify_first[mask], self.replace[mask], self.guarded[mask], self.open_rows)

    def jobs(
        self, cols: SourceColumns, pick: SourcePicker, result: PassResult, start: int, stop: int
    ) -> tuple[list[Job], set[str]]:
        """The jobs of entries ``start:stop``, and the paths among them whose object may not be replaced."""
        rows = self.rows[start:stop]
        jobs, guarded = [], set()
        for k, (row, ref) in enumerate(zip(rows.tolist(), cols.refs(rows), strict=True)):
            i = start + k
            if self.guarded[i]:
                guarded.add(ref.path)
            sources = () if self.guarded[i] else pick(row)
            jobs.append(Job(result.dataset, result.version_id, ref, sources, result.destination,
                            verify_first=bool(self.verify_first[i]), replace=bool(self.replace[i])))  # fmt: skip
        return jobs, guarded


def _size_or_missing(loc: Location, path: str) -> int:
    try:
        return loc.size(path)
    except FileNotFoundError:
        return MISSING


def _sizes(loc: Location, paths: list[str]) -> Iterator[int]:
    """The size of each of ``paths`` at ``loc`` (``MISSING``: none): a local stat each, or HEAD_THREADS
    lookups at a time elsewhere."""
    if loc.local:
        for path in paths:
            try:
                yield os.stat(loc.full(path)).st_size
            except FileNotFoundError:
                yield MISSING
            except OSError as exc:
                raise StorageError(f"cannot stat {loc.url}/{path}: {exc}") from exc
        return
    with ThreadPoolExecutor(HEAD_THREADS, thread_name_prefix="ferry-head") as pool:
        yield from pool.map(lambda path: _size_or_missing(loc, path), paths)


def _unreplaceable(plan: ColumnPlan, cols: SourceColumns, dst: Location) -> np.ndarray:
    """A bool per row: the plan copies or verifies it where an object already stands at the destination (wrong
    size, known bad, or not yet verified) that a copy may not replace. Shard objects are never rewritten,
    except to repair one that the destination's current version names with the very digest being copied."""
    at_risk = np.concatenate([plan.copy_rows[plan.copy_reasons != REASONS.index("missing")], plan.verify_rows])
    out = np.zeros(len(cols), dtype=bool)
    if not len(at_risk):
        return out
    out[at_risk] = True
    try:
        got = read_header(dst)
        if got is None:
            return out
        named = SourceColumns.of(load_version(dst, got[0]))
    except (ManifestError, StorageError):
        return out  # an unreadable destination version names nothing: nothing there is replaced
    if not len(named):
        return out
    index = int64s(at_risk)
    at = positions(pc.index_in(cols.paths.take(index), value_set=named.paths))
    named_digests = named.digests.take(int64s(np.maximum(at, 0)))
    same = bools(pc.equal(cols.digests.take(index), named_digests)) & (at >= 0)
    out[at_risk[same]] = False
    return out


def _kept(r: JobResult, guarded: set[str], dst: Location) -> JobResult:
    """A guarded shard whose object at the destination is not the one wanted: a fatal error saying so."""
    path = r.job.shard.path
    if path in guarded and not r.ok and not r.cancelled:
        if not r.corrupt:  # gone since the listing: copied by the next pass like any missing shard
            r.error = f"{dst.url}/{path} vanished while it was being checked; the next pass copies it"
            return r
        r.retryable = False
        r.error = (
            f"{dst.url}/{path} holds other bytes than version {r.job.version} names ({r.error or 'mismatch'}); "
            "ferry never replaces a stored shard object, which another version may name: delete it there if "
            "no version names it, then retry"
        )
    return r
