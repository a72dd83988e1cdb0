"""Which shards to stage and which to evict, from the read plans of the jobs on a cluster. Pure: no I/O.

Each job's shard read order is computed with the loader's own index math (``ferry.client.sampling``):
its mixture schedule names the source of each global stream position and the position in that source's
stream, the source's order (shuffle, seed, window) the sample, and the sample its shards. From the job's
position on, the shards it reads are listed in order of first read until they hold ``horizon`` bytes.

Within a mixture the sources interleave as the loader reads them (by the stream position of each first read).
The lists of all jobs are merged by how soon a shard is read (the fewest bytes any job reads before it)
and taken in that order while they fit the ``budget``: that is the set to hold. A staged shard outside it
is evicted (every job has passed it, or reads it only beyond its horizon); a staged shard inside it never
is. Shards are keyed by (dataset, path): a shard's path names its digest, so versions share shards.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ferry.client.sampling.order import SampleOrder, make_order
from ferry.client.sampling.schedule import Schedule
from ferry.client.sampling.shards import first_reads, first_samples, samples_of

__all__ = ["DatasetShards", "JobReads", "SourceReads", "StagingPlan", "coming_shards", "plan_staging", "Key"]

Key = tuple[str, str]  # (dataset, shard path)
CHUNK = 4096  # stream positions examined at a time
MAX_POSITIONS = 1 << 20  # positions one job's walk examines at most per plan (bounds the planner's time)


@dataclass(frozen=True)
class DatasetShards:
    """One version of a dataset, as the planner needs it (from its manifest)."""

    dataset: str
    paths: Sequence[str]
    sizes: np.ndarray  # stored bytes per shard
    token_offsets: np.ndarray  # one per shard and the total
    documents: np.ndarray  # per shard


@dataclass(frozen=True)
class SourceReads:
    """One source of a job: its dataset and everything its order depends on."""

    shards: DatasetShards
    seed: int
    shuffle: str
    window: int
    mode: str
    seq_len: int
    era_start: int = 0  # the source's stream positions before this belong to earlier versions (not staged)


@dataclass(frozen=True)
class JobReads:
    """A job as the planner sees it: where it stands and, per source of its schedule, what it reads (None: a
    source staging does not serve, e.g. a dataset outside the cluster)."""

    job_id: str
    position: int  # global stream position of the next batch
    phases: Sequence[tuple[int, Sequence[int]]]
    sources: Sequence[SourceReads | None]


@dataclass
class StagingPlan:
    stage: list[Key] = field(default_factory=list)  # to copy in, soonest read first
    evict: list[Key] = field(default_factory=list)
    hold: dict[Key, int] = field(default_factory=dict)  # what staging holds once done: key -> bytes
    coming: dict[str, list[tuple[Key, int]]] = field(default_factory=dict)  # per job: its horizon, in read order

    def staged_ahead(self, staged: Mapping[Key, int]) -> dict[str, int]:
        """Per job: bytes of its horizon that ``staged`` holds."""
        return {job: sum(size for key, size in listed if key in staged) for job, listed in self.coming.items()}

    def missing(self, staged: Mapping[Key, int]) -> dict[str, int]:
        """Per job: bytes of its horizon that ``staged`` lacks."""
        return {job: sum(size for key, size in listed if key not in staged) for job, listed in self.coming.items()}


class _Walker:
    """The orders of one source, per era-free epoch (cached)."""

    def __init__(self, src: SourceReads) -> None:
        s = src.shards
        self.src = src
        self.first = first_samples(s.token_offsets, s.documents, src.seq_len, src.mode)
        self.n = samples_of(s.token_offsets, s.documents, src.seq_len, src.mode, len(s.paths))
        self.order: SampleOrder = make_order(src.shuffle, self.first, src.seed, src.window)

    def shards(self, stream_positions: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The shards the samples at ``stream_positions`` read, in order of first read, and for each the index into
        ``stream_positions`` of the position that reads it first."""
        keep = np.nonzero(stream_positions >= self.src.era_start)[0]
        if keep.size == 0 or self.n == 0:
            return [], keep
        epoch, within = np.divmod(stream_positions[keep] - self.src.era_start, self.n)
        ids = np.empty_like(within)
        for e in np.unique(epoch).tolist():
            sel = epoch == e
            ids[sel] = self.order.sample_ids(int(e), within[sel])
        s = self.src
        shards, at = first_reads(ids, self.first, s.shards.token_offsets, s.seq_len, s.mode)
        return shards, keep[np.asarray(at, dtype=np.int64)]


def coming_shards(job: JobReads, horizon: int, max_positions: int = MAX_POSITIONS) -> Iterator[tuple[Key, int]]:
    """(key, bytes) of the shards ``job`` reads from its position on, each once, in order of first read, until
    they hold ``horizon`` bytes (or ``max_positions`` positions were examined)."""
    schedule = Schedule(job.phases)
    walkers = [None if s is None else _Walker(s) for s in job.sources]
    seen: set[Key] = set()
    total = 0
    for lo in range(job.position, job.position + max_positions, CHUNK):
        positions = np.arange(lo, lo + CHUNK, dtype=np.int64)
        src, idx = schedule.locate(positions)
        firsts: list[tuple[int, DatasetShards, int]] = []  # (global position of the first read, dataset, shard)
        for j in np.unique(src).tolist():
            walker = walkers[j] if j < len(walkers) else None
            if walker is None:
                continue
            sel = src == j
            shards, at = walker.shards(idx[sel])
            firsts.extend(zip(positions[sel][at].tolist(), [walker.src.shards] * len(shards), shards, strict=True))
        firsts.sort(key=lambda f: f[0])  # stable: one sample's shards keep their order
        for _, data, s in firsts:
            key = (data.dataset, data.paths[s])
            if key in seen:
                continue
            seen.add(key)
            size = int(data.sizes[s])
            yield key, size
            total += size
            if total >= horizon:
                return
        if len(seen) >= sum(len(w.src.shards.paths) for w in walkers if w is not None):
            return  # every shard of every source is listed


def plan_staging(jobs: Sequence[JobReads], staged: Mapping[Key, int], *, horizon: int, budget: int) -> StagingPlan:
    """What to stage and evict so that staging holds, within ``budget`` bytes, the shards the jobs read soonest."""
    soonest: dict[Key, tuple[int, int]] = {}  # key -> (bytes any job reads before it, size)
    plan = StagingPlan()
    for job in jobs:
        before = 0
        listed = plan.coming[job.job_id] = []
        for key, size in coming_shards(job, horizon):
            listed.append((key, size))
            if key not in soonest or before < soonest[key][0]:
                soonest[key] = (before, size)
            before += size
    used = 0
    for key, (_, size) in sorted(soonest.items(), key=lambda kv: (kv[1][0], kv[0])):
        if used + size > budget:
            continue  # a smaller shard further on may still fit
        plan.hold[key] = size
        used += size
    plan.evict = sorted(k for k in staged if k not in plan.hold)
    plan.stage = [k for k in sorted(plan.hold, key=lambda k: (soonest[k][0], k)) if k not in staged]
    return plan
