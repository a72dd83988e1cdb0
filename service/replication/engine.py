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
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ferry.shard_tools.errors import DatasetNotFoundError, LeaseHeldError, ManifestError, RollbackError, StorageError
from ferry.shard_tools.format.header import MANIFEST_FILE, SHARDS_DIR, VERSIONS_DIR, parse_header, version_path
from ferry.shard_tools.storage.publish import carry_lineage, descends_from, store_version, swap_manifest
from ferry.shard_tools.storage.store import STALE_TEMP_SECONDS, TEMP_MARKER, Location, temp_is_stale

from ..events import EventBus
from ..transfer.executor import Executor, Job, JobResult
from ..transfer.object_store import abort_stale_uploads
from ..transfer.stats import Stats
from .lease import DEFAULT_TTL, Lease
from .passes import PassResult
from .planner import SourceVersion, SyncPlan, VersionRecord, order_sources, plan_retention, plan_sync
from .state import State

if TYPE_CHECKING:
    from ferry.shard_tools.format.manifest import Manifest

__all__ = ["Engine", "PassResult", "read_header", "load_version", "listing"]


def read_header(loc: Location, rel: str = MANIFEST_FILE) -> tuple[bytes, dict[str, Any]] | None:
    """The raw bytes and parsed header of ``rel`` (None where it does not exist)."""
    try:
        data = loc.read_bytes(rel)
    except FileNotFoundError:
        return None
    return data, parse_header(data)


def load_version(loc: Location, header: bytes) -> tuple[Manifest, bytes]:
    """The manifest whose header is ``header`` with its shard table read from ``loc``."""
    from ferry.shard_tools.format.manifest import Manifest  # numpy + pyarrow: only when there is work to plan

    doc = parse_header(header)
    try:
        table = loc.read_bytes(doc["shard_table"]["path"])
    except FileNotFoundError as exc:
        raise ManifestError(f"shard table {doc['shard_table']['path']} is missing at {loc.url}") from exc
    return Manifest.from_json(header, table), table


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
    ) -> None:
        """``writer`` names this kind of writer in the destination's lease (daemon, sync);
        ``allow_rollback`` lets a pass publish a version that does not descend from the
        destination's current one (the user forces it)."""
        self.executor = executor
        self.writer = writer
        self.lease_ttl = lease_ttl
        self.allow_rollback = allow_rollback
        self.state = state
        self.stats: Stats = executor.stats
        self.events = events or EventBus()
        self.keep_versions = keep_versions
        self.priority = dict(priority or {})

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
        manifest, table = load_version(src_loc, src_bytes)
        src_version = SourceVersion.of(manifest)
        held = listing_with_age(dst_loc)
        others = {p: [c for c in cs if c != dest and c in locations] for p, cs in self.state.replicas(dataset).items()}
        peers = [c for c in locations if c not in (source, dest) and _publishes(locations[c], version)]
        if peers:  # published by another cluster's daemon (pull model: nothing shared but storage)
            for s in src_version.shards:
                have = others.setdefault(s.path, [])
                have += [c for c in peers if c not in have]
        plan = plan_sync(
            src_version,
            source=source,
            dest_version=dest_version,
            listing={p: size for p, (size, _) in held.items()},
            verified=self.state.verified(dataset, dest),
            known_bad=self.state.bad(dataset, dest),
            replicas={p: cs for p, cs in others.items() if cs},
            priority=self.priority,
        )
        for tmp in plan.delete_temps:
            if not temp_is_stale(tmp.path, held[tmp.path][1]):
                continue  # a live writer's (a pack on this host, or recent: another host's)
            with contextlib.suppress(StorageError):
                dst_loc.remove(tmp.path)
                result.temps_deleted += 1
        with contextlib.suppress(StorageError):
            result.temps_deleted += abort_stale_uploads(dst_loc)
        result.already_verified = len(plan.verified)
        result.verified_bytes = sum(s.size for s in plan.verified)
        jobs, guarded = self._jobs(plan, dataset, version, dest, dst_loc)
        result.skipped_failed = len(plan.copies) + len(plan.verifies) - len(jobs)
        self.stats.set_pending(dataset, dest, sum(j.shard.size for j in jobs), len(jobs))
        if on_plan is not None:
            on_plan(result)
        if jobs:
            stop = lambda: lease.lost is not None  # noqa: E731
            self.executor.run(jobs, locations, lambda r: self._on_result(_kept(r, guarded, dst_loc), result),
                              self._history, stop=stop)  # fmt: skip
            self.state.flush()  # the pass's verified marks are committed before its manifest is published
        if lease.lost is not None:
            raise LeaseHeldError(
                f"{dst_loc.url}: lost the writer lease while copying ({lease.lost}); stopped copying into it, "
                "nothing published (the next pass takes the lease again if it is free)",
                holder=lease.lost_to,
                retryable=True,
            )
        if result.ok:
            self._publish(src_loc, dst_loc, manifest, table, src_bytes, result)
            if self.keep_versions and result.published:
                self._retain(dst_loc, manifest, dataset, dest, held, result)

    def _jobs(self, plan: SyncPlan, dataset: str, version: str, dest: str, dst: Location) -> tuple[list[Job], set[str]]:
        """The plan's copies and verifies as jobs (less shards failed for good), and the paths whose object
        at the destination must not be replaced: those jobs only verify it (no sources to copy from)."""
        fatal = self.state.fatal(dataset, dest)
        guarded = _unreplaceable(plan, dst)
        # an object standing at a path that is not guarded is a damaged copy of what the destination's current
        # version names: the one case a copy replaces it (a repair); every other copy only creates the object
        jobs = [
            Job(dataset, version, c.shard, (), dest, verify_first=True)
            if c.shard.path in guarded
            else Job(dataset, version, c.shard, c.sources, dest, replace=c.reason != "missing")
            for c in plan.copies
            if c.shard.path not in fatal
        ]
        jobs += [
            Job(dataset, version, v.shard, v.sources, dest, verify_first=True, replace=True)
            if v.shard.path not in guarded
            else Job(dataset, version, v.shard, (), dest, verify_first=True)
            for v in plan.verifies
            if v.shard.path not in fatal
        ]
        return jobs, guarded

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

    def _publish(
        self, src: Location, dst: Location, manifest: Manifest, table: bytes, header: bytes, res: PassResult
    ) -> None:
        """versions/<id>.json, then manifest.json by compare-and-swap: only over an ancestor (or
        nothing), so a slower writer of an older version can never roll the destination back."""
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
        self.state.completed_version(res.dataset, res.destination, version)
        self._event("version_published", dataset=res.dataset, version=version, cluster=res.destination)

    def _retain(
        self,
        dst: Location,
        current: Manifest,
        dataset: str,
        dest: str,
        held: Mapping[str, tuple[int, float | None]],
        res: PassResult,
    ) -> None:
        assert self.keep_versions
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
                    m, _ = load_version(dst, got[0])
                except (ManifestError, StorageError):
                    continue  # an unreadable old version is left alone
            generation = int(m.lineage["gen"]) if m.lineage else 0
            records.append(VersionRecord(vid, m.created_at, frozenset(m.shards.paths), m.table_path, generation))
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
        src_paths = set(current.shards.paths)
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
        manifest, _ = load_version(loc, got[0])
        others = order_sources([c for c in locations if c != cluster], self.priority)
        jobs = [
            Job(dataset, manifest.version_id, s, others, cluster, verify_first=True, replace=True)
            for s in SourceVersion.of(manifest).shards
        ]
        bad: list[str] = []
        repaired: list[str] = []

        def done(r: JobResult) -> None:
            path = r.job.shard.path
            if r.corrupt or r.copied:
                bad.append(path)
                if r.ok:
                    repaired.append(path)
                else:
                    self.state.mark_bad(dataset, cluster, path, r.error or "corrupt")
            if r.ok:
                self.state.add_verified(dataset, cluster, [path])

        self.executor.run(jobs, locations, done, self._history)
        return len(jobs), sorted(bad), sorted(repaired)


def _unreplaceable(plan: SyncPlan, dst: Location) -> set[str]:
    """Paths of the plan where an object already stands at the destination (wrong size, known bad, or
    not yet verified) that a copy may not replace: shard objects are never rewritten, except to repair
    one that the destination's current version names with the very digest being copied."""
    at_risk = [c.shard for c in plan.copies if c.reason != "missing"] + [v.shard for v in plan.verifies]
    if not at_risk:
        return set()
    named: dict[str, str] = {}
    try:
        got = read_header(dst)
        if got is not None:
            named = {s.path: s.digest for s in SourceVersion.of(load_version(dst, got[0])[0]).shards}
    except (ManifestError, StorageError):
        named = {}  # an unreadable destination version names nothing: nothing there is replaced
    return {s.path for s in at_risk if named.get(s.path) != s.digest}


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
