"""Prefetch by the known future: the shards of the next batches, in the order they are first read, across
window and epoch boundaries, up to a horizon in bytes and never beyond the free part of the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scripts.loader_common import pack_test_dataset

from client import TokenDataset
from client.partition import rank_positions

BATCH = 8


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("prefetch") / "ds"), 300, shard_size=4096)


def _expected(ds: TokenDataset, positions_of: Any, i: int, depth: int, horizon: int) -> list[int]:
    """Brute force: walk the batches after batch ``i``, shards in order of first read, until both limits."""
    seen: dict[int, None] = {}
    total = 0
    j = i
    while (j - i < depth or total < horizon) and j - i < 1000:
        j += 1
        for s in ds.shards_of(positions_of(j)):
            if s not in seen:
                seen[s] = None
                total += int(ds.manifest.shards.raw_bytes[s])
    return list(seen)


@pytest.mark.parametrize("shards_ahead", [1, 3, 12])
def test_prefetch_follows_the_order_past_windows_and_epochs(local: str, tmp_path: Path, shards_ahead: int) -> None:
    ds = TokenDataset(local, seq_len=32, seed=2, shuffle="window", window=2, cache_dir=str(tmp_path / "c"), prefetch=1)
    shard = int(ds.manifest.shards.raw_bytes.max())
    ds.prefetch_bytes = shards_ahead * shard
    submitted: list[int] = []
    ds._submit = submitted.extend  # type: ignore[method-assign]

    def positions_of(j: int) -> np.ndarray:
        return rank_positions(0, j, BATCH, 1, 0)

    last = ds.num_samples // BATCH - 1  # the last batch of epoch 0: everything ahead is in epoch 1
    for _ in range(20):  # the scan walks at most a few dozen batches per call: call until it stops growing
        before = len(submitted)
        ds.prefetch_ahead(("plan",), last, positions_of)
        if len(submitted) == before:
            break
    want = _expected(ds, positions_of, last, 1, shards_ahead * shard)
    assert submitted == want and len(set(submitted)) == len(submitted)
    assert set(ds.shards_of(positions_of(last + 1))) <= set(submitted)  # epoch 1's first batch
    if shards_ahead == 12:  # more than the dataset: every shard, in epoch 1's order
        assert sorted(submitted) == list(range(len(ds.manifest.shards)))
    ds.close()


def test_prefetch_never_exceeds_the_free_part_of_the_cache(local: str, tmp_path: Path) -> None:
    probe = TokenDataset(local, seq_len=32, shuffle="window", window=2, cache_dir=str(tmp_path / "p"))
    shard = int(probe.manifest.shards.raw_bytes.max())
    limit = 4 * shard
    ds = TokenDataset(
        local, seq_len=32, shuffle="window", window=2, cache_dir=str(tmp_path / "c"), cache_limit=limit, prefetch=1,
        prefetch_bytes=100 * shard,
    )  # fmt: skip
    submitted: list[int] = []
    ds._submit = submitted.extend  # type: ignore[method-assign]
    for _ in range(200):
        before = len(submitted)
        ds.prefetch_ahead(("plan",), 0, lambda j: rank_positions(0, j, BATCH, 1, 0))
        if len(submitted) == before:
            break
    sizes = ds.manifest.shards.raw_bytes
    # the scan stops once the shards ahead reach the cache share: at most one shard past it
    assert sum(int(sizes[s]) for s in submitted[:-1]) < limit
    assert len(submitted) < len(ds.manifest.shards)
