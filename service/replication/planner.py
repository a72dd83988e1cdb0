"""The pure replication planner: manifests and a listing in, actions out (no I/O here).

``plan_sync`` compares the source version with what a destination holds and says which
shards to copy (with the replicas to pull from, nearest first), which present shards to
re-hash, which stale temp files to delete, and whether the version can be published now.
``plan_retention`` decides which published versions a destination retires and which
shards it may delete, never the last verified copy anywhere.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ferry.shard_tools.storage.store import TEMP_MARKER

from ..transfer.executor import ShardRef  # what the executor copies is what the planner plans

if TYPE_CHECKING:
    from ferry.shard_tools.format.manifest import Manifest

__all__ = [
    "ShardRef",
    "SourceVersion",
    "CopyShard",
    "VerifyShard",
    "DeleteTemp",
    "SyncPlan",
    "plan_sync",
    "VersionRecord",
    "RetentionPlan",
    "plan_retention",
    "order_sources",
]


@dataclass(frozen=True)
class SourceVersion:
    """The version to replicate: its id and its shards in manifest order."""

    version_id: str
    shards: Sequence[ShardRef]

    @classmethod
    def of(cls, manifest: Manifest) -> SourceVersion:
        t = manifest.shards
        # column by column: one ShardInfo per row is the slow part of a plan at hundreds of thousands of shards
        digests = t._digests[0]  # noqa: SLF001 - ShardTable has no public digest column
        sizes = t.stored_bytes.tolist()
        return cls(manifest.version_id, [ShardRef(p, n, d) for p, n, d in zip(t.paths, sizes, digests, strict=True)])

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


@dataclass(frozen=True)
class CopyShard:
    """Copy ``shard`` to the destination, trying ``sources`` (cluster names) in order."""

    shard: ShardRef
    sources: tuple[str, ...]
    reason: str  # "missing" | "size" (wrong size at the destination) | "corrupt" (known bad digest)


@dataclass(frozen=True)
class VerifyShard:
    """The destination holds ``shard`` with the right size but it was never verified there: re-hash it."""

    shard: ShardRef
    sources: tuple[str, ...]  # where to copy from if the hash is wrong


@dataclass(frozen=True)
class DeleteTemp:
    """A temp file left by an interrupted write."""

    path: str


@dataclass
class SyncPlan:
    """What one sync pass of one (dataset, destination) does."""

    version_id: str
    up_to_date: bool  # the destination already publishes this version
    copies: list[CopyShard] = field(default_factory=list)
    verifies: list[VerifyShard] = field(default_factory=list)
    delete_temps: list[DeleteTemp] = field(default_factory=list)
    verified: list[ShardRef] = field(default_factory=list)  # already verified there, nothing to do
    publish: bool = False  # publish right away (nothing to copy or verify)

    @property
    def pending_bytes(self) -> int:
        return sum(c.shard.size for c in self.copies) + sum(v.shard.size for v in self.verifies)


def order_sources(
    candidates: Collection[str], priority: Mapping[str, int], source: str | None = None
) -> tuple[str, ...]:
    """Replicas to pull from, nearest (lowest priority) first; ties prefer the rule's source, then name."""
    return tuple(sorted(set(candidates), key=lambda c: (priority.get(c, 100), c != source, c)))


def plan_sync(
    src: SourceVersion,
    *,
    source: str,
    dest_version: str | None,
    listing: Mapping[str, int] | None,
    verified: Collection[str] = (),
    known_bad: Collection[str] = (),
    replicas: Mapping[str, Collection[str]] | None = None,
    priority: Mapping[str, int] | None = None,
) -> SyncPlan:
    """Plan one destination.

    ``dest_version`` is the version the destination's manifest.json names (None if none).
    ``listing`` maps every object under the destination's dataset prefix (relative path) to its
    size; it may be None when ``dest_version == src.version_id`` (nothing else is looked at then).
    ``verified`` are paths known verified at the destination, ``known_bad`` paths found corrupt
    there (by a scrub or a failed verify), ``replicas`` maps a path to other clusters holding a
    verified copy; ``source`` (the rule's source cluster) is always a candidate.
    """
    if dest_version == src.version_id:
        return SyncPlan(src.version_id, up_to_date=True, verified=list(src.shards))
    if listing is None:
        raise ValueError("a listing of the destination is needed when its version differs")
    prio = priority or {}
    others = replicas or {}
    verified_set = set(verified)
    bad = set(known_bad)
    plan = SyncPlan(src.version_id, up_to_date=False)
    plan.delete_temps = [DeleteTemp(p) for p in sorted(listing) if TEMP_MARKER in posixpath.basename(p)]
    default_sources = (source,)
    for shard in src.shards:
        have = listing.get(shard.path)
        extra = others.get(shard.path)
        sources = order_sources({source, *extra}, prio, source) if extra else default_sources
        if have is None:
            plan.copies.append(CopyShard(shard, sources, "missing"))
        elif have != shard.size:
            plan.copies.append(CopyShard(shard, sources, "size"))
        elif shard.path in bad:
            plan.copies.append(CopyShard(shard, sources, "corrupt"))
        elif shard.path in verified_set:
            plan.verified.append(shard)
        else:
            plan.verifies.append(VerifyShard(shard, sources))
    plan.publish = not plan.copies and not plan.verifies
    return plan


@dataclass(frozen=True)
class VersionRecord:
    """A version published at a destination: id, creation time (sortable string, whole seconds), shards,
    table, and its generation in its lineage (0 for a first version), which orders versions of one second."""

    version_id: str
    created_at: str
    paths: frozenset[str]
    table_path: str
    generation: int = 0


@dataclass
class RetentionPlan:
    """Versions to retire and files to delete at one destination."""

    keep: list[str] = field(default_factory=list)
    retire: list[str] = field(default_factory=list)
    delete_shards: list[str] = field(default_factory=list)
    delete_tables: list[str] = field(default_factory=list)
    protected: list[str] = field(default_factory=list)  # unreferenced, but the last verified copy: kept


def plan_retention(
    versions: Sequence[VersionRecord],
    *,
    current: str,
    keep_versions: int,
    copies_elsewhere: Mapping[str, int],
    orphans: Collection[str] = (),
) -> RetentionPlan:
    """Keep ``current`` and the newest others (by generation, then creation time) up to ``keep_versions`` in
    all; retire the rest.

    A shard of a retired version is deleted only when no kept version references it and
    ``copies_elsewhere[path] > 0`` (a verified copy exists on another cluster). ``orphans`` are
    shards the destination holds that no published version names (kept earlier as last copies);
    they get the same treatment, so they go once a copy exists elsewhere.
    """
    if keep_versions < 1:
        raise ValueError("keep_versions must be at least 1")
    by_age = sorted(versions, key=lambda v: (v.generation, v.created_at, v.version_id), reverse=True)
    kept_ids = [current] if any(v.version_id == current for v in versions) else []
    for v in by_age:
        if len(kept_ids) >= keep_versions:
            break
        if v.version_id not in kept_ids:
            kept_ids.append(v.version_id)
    kept = [v for v in versions if v.version_id in kept_ids]
    retired = [v for v in by_age if v.version_id not in kept_ids]
    plan = RetentionPlan(keep=kept_ids, retire=[v.version_id for v in retired])
    referenced: set[str] = set().union(*(v.paths for v in kept)) if kept else set()
    kept_tables = {v.table_path for v in kept}
    doomed: set[str] = set(orphans) - referenced
    for v in retired:
        doomed |= v.paths - referenced
        if v.table_path not in kept_tables and v.table_path not in plan.delete_tables:
            plan.delete_tables.append(v.table_path)
    for path in sorted(doomed):
        if copies_elsewhere.get(path, 0) > 0:
            plan.delete_shards.append(path)
        else:
            plan.protected.append(path)
    return plan
