"""The staging planner lists a job's shards in the order its real loader reads them, and merges the jobs of a
cluster into what to stage and evict within a budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import pack

from ferry.client.sampling.shards import first_samples
from ferry.client.stream.dataset import TokenDataset
from ferry.service.jobs.staging_plan import DatasetShards, JobReads, SourceReads, coming_shards, plan_staging


def shards_of(ds: TokenDataset, name: str) -> DatasetShards:
    t = ds.manifest.shards
    return DatasetShards(name, t.paths, np.asarray(t.stored_bytes), t.token_offsets, np.asarray(t.documents))


def reads(ds: TokenDataset, name: str) -> SourceReads:
    return SourceReads(shards_of(ds, name), ds.seed, ds.shuffle, ds.window, ds.mode, ds.seq_len)


def loader_order(per_position: list[list[int]], paths: list[str], name: str) -> list[tuple[str, str]]:
    out: dict[tuple[str, str], None] = {}
    for shards in per_position:
        for s in shards:
            out[(name, paths[s])] = None
    return list(out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(pack(str(tmp_path_factory.mktemp("plan") / "corpus"), 120, shard_size=4096).url)


@pytest.mark.parametrize(
    ("shuffle", "mode", "window"),
    [("global", "tokens", 8), ("window", "tokens", 3), ("none", "tokens", 8), ("window", "document", 2)],
)
def test_a_job_is_staged_in_the_order_its_loader_reads(
    corpus: str, tmp_path: Path, shuffle: str, mode: str, window: int
) -> None:
    ds = TokenDataset(corpus, seq_len=24, seed=5, shuffle=shuffle, window=window, mode=mode,
                      cache_dir=str(tmp_path / "cache"))  # fmt: skip
    try:
        assert np.array_equal(ds._first, first_samples(ds.manifest.shards.token_offsets,
                                                       np.asarray(ds.manifest.shards.documents), 24, mode))  # fmt: skip
        start = ds.num_samples - 37  # across an epoch boundary
        positions = range(start, start + 2 * ds.num_samples)
        expected = loader_order([ds.shards_of(np.asarray([p])) for p in positions], ds.manifest.shards.paths, "c")
        job = JobReads("j", start, [(0, [1])], [reads(ds, "c")])
        listed = [key for key, _ in coming_shards(job, horizon=10**15)]
        assert listed == expected[: len(listed)] and len(listed) == len(ds.manifest.shards)
    finally:
        ds.close()


def test_a_mixture_is_staged_in_the_order_its_loader_reads(corpus: str, tmp_path: Path) -> None:
    other = str(pack(str(tmp_path / "other"), 60, seed=3, shard_size=4096).url)
    a = TokenDataset(corpus, seq_len=16, seed=1, shuffle="window", window=2, cache_dir=str(tmp_path / "ca"))
    b = TokenDataset(other, seq_len=16, seed=2, shuffle="global", cache_dir=str(tmp_path / "cb"))
    mixed = TokenDataset.mix([a, b], [(0, [3, 1]), (500, [0, 1]), (900, [1, 1])])
    try:
        src, idx = mixed.schedule.locate(np.arange(0, 3000, dtype=np.int64))
        per_position = []
        for j, i in zip(src.tolist(), idx.tolist(), strict=True):
            ds, name = (a, "a") if j == 0 else (b, "b")
            per_position.append([(name, ds.manifest.shards.paths[s]) for s in ds.shards_of(np.asarray([i]))])
        expected = list(dict.fromkeys(k for keys in per_position for k in keys))
        phases = [(s, list(q)) for s, q in mixed.schedule.phases]
        job = JobReads("j", 0, phases, [reads(a, "a"), reads(b, "b")])
        listed = [key for key, _ in coming_shards(job, horizon=10**15, max_positions=3000)]
        assert listed == expected  # the sources interleaved as the loader reads them, not source by source
    finally:
        a.close()
        b.close()


def _dataset(name: str, sizes: list[int]) -> DatasetShards:
    """A dataset of shards holding 10 samples of seq_len 1 each (tokens: 10 per shard, plus one at the end)."""
    offsets = np.asarray([10 * i for i in range(len(sizes))] + [10 * len(sizes) + 1], dtype=np.int64)
    return DatasetShards(name, [f"shards/{name}{i}" for i in range(len(sizes))], np.asarray(sizes),
                         offsets, np.ones(len(sizes), dtype=np.int64))  # fmt: skip


def _job(job_id: str, position: int, data: DatasetShards) -> JobReads:
    return JobReads(job_id, position, [(0, [1])], [SourceReads(data, 0, "none", 1, "tokens", 1)])


def test_the_plan_holds_what_is_read_soonest_within_the_budget_and_evicts_the_rest() -> None:
    data = _dataset("d", [100] * 10)  # shuffle none: shard k holds positions [10k, 10k + 10)
    key = lambda i: ("d", f"shards/d{i}")  # noqa: E731
    fast, slow = _job("fast", 55, data), _job("slow", 12, data)
    staged = {key(0): 100, key(1): 100, key(5): 100, key(9): 100}
    plan = plan_staging([fast, slow], staged, horizon=300, budget=500)
    # fast reads 5, 6, 7; slow reads 1, 2, 3: merged by how soon, within 500 bytes
    assert set(plan.hold) == {key(1), key(5), key(2), key(6), key(3)}
    assert plan.stage == [key(2), key(6), key(3)]  # 2 and 6 are each a job's second shard, then the third
    assert plan.evict == [key(0), key(9)]  # every job passed 0; 9 is beyond every horizon
    assert plan.staged_ahead(staged) == {"fast": 100, "slow": 100} and plan.missing(staged) == {
        "fast": 200,
        "slow": 200,
    }
    # once staged, the slow job misses nothing; shard 7 of the fast one is past the budget: missing (alerted)
    assert plan.missing({**staged, **plan.hold}) == {"fast": 100, "slow": 0}
    assert sum(plan.hold.values()) <= 500


def test_a_shard_about_to_be_read_is_never_evicted_and_the_budget_never_exceeded() -> None:
    data = _dataset("d", [100, 400, 100, 100])
    key = lambda i: ("d", f"shards/d{i}")  # noqa: E731
    plan = plan_staging([_job("a", 0, data)], {key(0): 100}, horizon=10**6, budget=250)
    assert key(0) in plan.hold and plan.evict == []  # being read now: kept
    assert key(1) not in plan.hold and plan.stage == [key(2)]  # 400 does not fit; the next that does is taken
    assert sum(plan.hold.values()) <= 250
    assert plan_staging([], {key(0): 100}, horizon=100, budget=100).evict == [key(0)]  # no job: all passed
