"""The pure replication planner: manifests and what a destination holds in, actions out (no I/O here).

``plan_columns`` compares the source version, column by column (``SourceColumns``: paths, sizes,
digests as Arrow/numpy arrays, never one Python object per shard), with what a destination holds and
says which rows to copy, which present shards to re-hash, which stale temp files to delete, and
whether the version can be published now. ``SourcePicker`` gives a row's replicas to pull from,
nearest first. ``plan_sync`` is the same plan for a few shards given as objects (``SourceVersion``).
``plan_retention`` decides which published versions a destination retires and which shards it may
delete, never the last verified copy anywhere.
"""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ferry.shard_tools.format.arrays import one_array
from ferry.shard_tools.storage.store import TEMP_MARKER

from ..transfer.executor import ShardRef  # what the executor copies is what the planner plans
from .columns import bools, common_prefix, int64s, positions, strings

if TYPE_CHECKING:
    from ferry.shard_tools.format.manifest import Manifest, StoredShards

__all__ = [
    "ShardRef",
    "SourceColumns",
    "SourceVersion",
    "ColumnPlan",
    "SourcePicker",
    "plan_columns",
    "CopyShard",
    "VerifyShard",
    "DeleteTemp",
    "SyncPlan",
    "plan_sync",
    "VersionRecord",
    "RetentionPlan",
    "plan_retention",
    "order_sources",
    "MISSING",
    "REASONS",
]

#: a copy's reason, by its code in ``ColumnPlan.copy_reasons``: the shard is missing at the destination,
#: has the wrong size there, or is known bad there (a scrub or a failed verify found it corrupt)
REASONS = ("missing", "size", "corrupt")
#: the size of a shard the destination does not hold (in a ``held_sizes`` column)
MISSING = -1


@dataclass(frozen=True)
class SourceColumns:
    """The version to replicate, column by column in manifest order: paths, stored sizes, stored digests (the
    16 bytes of each, as ``StoredShards`` holds them)."""

    version_id: str
    paths: pa.StringArray
    sizes: np.ndarray  # int64
    digests: pa.FixedSizeBinaryArray

    @classmethod
    def of(cls, manifest: Manifest | StoredShards) -> SourceColumns:
        """The columns of a loaded version (no copy)."""
        from ferry.shard_tools.format.manifest import StoredShards, digest_column  # loaded already: the version is

        if isinstance(manifest, StoredShards):
            return cls(manifest.version_id, manifest.paths, manifest.stored_bytes, manifest.stored_digests)
        table = manifest.shards._table  # noqa: SLF001 - ShardTable has no public string columns
        return cls(manifest.version_id, _one_chunk(table.column("path")), manifest.shards.stored_bytes,
                   digest_column(_one_chunk(table.column("stored_digest"))))  # fmt: skip

    @classmethod
    def of_refs(cls, version_id: str, shards: Sequence[ShardRef]) -> SourceColumns:
        from ferry.shard_tools.format.manifest import digest_column

        return cls(
            version_id,
            strings(s.path for s in shards),
            np.array([s.size for s in shards], dtype=np.int64),
            digest_column(strings(s.digest for s in shards)),
        )

    def __len__(self) -> int:
        return len(self.sizes)

    def refs(self, rows: np.ndarray) -> list[ShardRef]:
        """The shards of ``rows`` as objects (for the few being copied now)."""
        from ferry.shard_tools.format.manifest import digest_strings

        index = int64s(rows)
        paths, digests = self.paths.take(index).to_pylist(), digest_strings(self.digests.take(index))
        return [ShardRef(p, int(n), d) for p, n, d in zip(paths, self.sizes[rows].tolist(), digests, strict=True)]

    def has(self, paths: pa.Array | Iterable[str]) -> np.ndarray:
        """A bool per row: is its path among ``paths``. Where ``paths`` begins with this version's rows in
        their order (a verified set recorded at a publish, see ``State.verified_version``), that prefix is
        one comparison and only the rest is hashed; a row repeating a path of that prefix further down
        then reads False (the caller looks it up again: never a wrong True)."""
        values = paths if isinstance(paths, pa.Array) else strings(paths)
        out = np.zeros(len(self), dtype=bool)
        if len(self) == 0 or len(values) == 0:
            return out
        m = common_prefix(self.paths, values)
        out[:m] = True
        if m < len(self) and m < len(values):
            out[m:] = bools(pc.is_in(self.paths.slice(m), value_set=values.slice(m)))
        return out

    def held_sizes(self, listing: Mapping[str, int]) -> np.ndarray:
        """The size of each row's object in ``listing`` (path → size), ``MISSING`` where it has none."""
        if not listing:
            return np.full(len(self), MISSING, dtype=np.int64)
        names = strings(listing)
        sizes = np.fromiter(listing.values(), dtype=np.int64, count=len(listing))
        at = positions(pc.index_in(self.paths, value_set=names))
        return np.where(at >= 0, sizes[np.maximum(at, 0)], MISSING)

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())


def _one_chunk(column: pa.ChunkedArray) -> pa.StringArray:
    """The column as one string array (its chunk itself where it has one)."""
    chunk = one_array(column)
    assert isinstance(chunk, pa.StringArray)
    return chunk


@dataclass
class ColumnPlan:
    """What one sync pass of one (dataset, destination) does, as row numbers of its ``SourceColumns``."""

    version_id: str
    up_to_date: bool  # the destination already publishes this version
    copy_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    copy_reasons: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # index into REASONS
    verify_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    verified_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # nothing to do
    delete_temps: list[DeleteTemp] = field(default_factory=list)
    publish: bool = False  # publish right away (nothing to copy or verify)


def plan_columns(
    src: SourceColumns,
    *,
    dest_version: str | None,
    held_sizes: np.ndarray | None,
    verified: np.ndarray | None = None,
    bad: np.ndarray | None = None,
    temps: Iterable[str] = (),
) -> ColumnPlan:
    """Plan one destination.

    ``dest_version`` is the version the destination's manifest.json names (None if none).
    ``held_sizes`` is the size of each row's object at the destination (``MISSING``: none); it may be
    None when ``dest_version == src.version_id`` (nothing else is looked at then). ``verified`` marks
    rows known verified at the destination, ``bad`` rows found corrupt there (by a scrub or a failed
    verify). ``temps`` are the temp files the destination holds (a listing's).
    """
    n = len(src)
    if dest_version == src.version_id:
        return ColumnPlan(src.version_id, up_to_date=True, verified_rows=np.arange(n, dtype=np.int64))
    if held_sizes is None:
        raise ValueError("a listing (or the sizes) of what the destination holds is needed when its version differs")
    no = np.zeros(n, dtype=bool)
    verified = no if verified is None else verified
    bad = no if bad is None else bad
    missing = held_sizes == MISSING
    wrong = ~missing & (held_sizes != src.sizes)
    corrupt = ~missing & ~wrong & bad
    copy = missing | wrong | corrupt
    reasons = np.where(missing, 0, np.where(wrong, 1, 2)).astype(np.uint8)
    rows = np.flatnonzero(copy)
    plan = ColumnPlan(src.version_id, up_to_date=False, copy_rows=rows, copy_reasons=reasons[rows])
    plan.verified_rows = np.flatnonzero(~copy & verified)
    plan.verify_rows = np.flatnonzero(~copy & ~verified)
    plan.delete_temps = [DeleteTemp(p) for p in sorted(temps) if TEMP_MARKER in posixpath.basename(p)]
    plan.publish = not len(plan.copy_rows) and not len(plan.verify_rows)
    return plan


def order_sources(
    candidates: Collection[str], priority: Mapping[str, int], source: str | None = None
) -> tuple[str, ...]:
    """Replicas to pull from, nearest (lowest priority) first; ties prefer the rule's source, then name."""
    return tuple(sorted(set(candidates), key=lambda c: (priority.get(c, 100), c != source, c)))


@dataclass(frozen=True)
class SourcePicker:
    """The replicas a row can be pulled from: the rule's ``source``, and each cluster of ``holders`` whose
    mask marks the row (it holds a verified copy of it), nearest first."""

    source: str
    priority: Mapping[str, int] = field(default_factory=dict)
    holders: Mapping[str, np.ndarray] = field(default_factory=dict)  # cluster → a bool per row

    def __call__(self, row: int) -> tuple[str, ...]:
        extra = [c for c, held in self.holders.items() if held[row]]
        return order_sources({self.source, *extra}, self.priority, self.source) if extra else (self.source,)


@dataclass(frozen=True)
class SourceVersion:
    """The version to replicate as objects: its id and its shards in manifest order (a few shards: tests,
    tools; a pass plans on ``SourceColumns``)."""

    version_id: str
    shards: Sequence[ShardRef]

    @classmethod
    def of(cls, manifest: Manifest | StoredShards) -> SourceVersion:
        cols = SourceColumns.of(manifest)
        return cls(cols.version_id, cols.refs(np.arange(len(cols))))

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


@dataclass(frozen=True)
class CopyShard:
    """Copy ``shard`` to the destination, trying ``sources`` (cluster names) in order."""

    shard: ShardRef
    sources: tuple[str, ...]
    reason: str  # one of REASONS


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
    """``plan_sync``'s plan: a ``ColumnPlan`` as objects."""

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
    """``plan_columns`` for shards given as objects. ``listing`` maps every object under the destination's
    dataset prefix (relative path) to its size; ``replicas`` maps a path to other clusters holding a
    verified copy; ``source`` (the rule's source cluster) is always a candidate."""
    cols = SourceColumns.of_refs(src.version_id, src.shards)
    plan = plan_columns(
        cols,
        dest_version=dest_version,
        held_sizes=None if listing is None else cols.held_sizes(listing),
        verified=cols.has(verified),
        bad=cols.has(known_bad),
        temps=listing or (),
    )
    clusters = {c for cs in (replicas or {}).values() for c in cs}
    holders = {c: cols.has(p for p, cs in (replicas or {}).items() if c in cs) for c in clusters}
    pick = SourcePicker(source, priority or {}, holders)
    shards = src.shards
    return SyncPlan(
        plan.version_id,
        plan.up_to_date,
        copies=[
            CopyShard(shards[i], pick(i), REASONS[r])
            for i, r in zip(plan.copy_rows.tolist(), plan.copy_reasons.tolist(), strict=True)
        ],
        verifies=[VerifyShard(shards[i], pick(i)) for i in plan.verify_rows.tolist()],
        delete_temps=plan.delete_temps,
        verified=[shards[i] for i in plan.verified_rows.tolist()],
        publish=plan.publish,
    )


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
