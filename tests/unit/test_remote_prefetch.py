"""Prefetch by the known future: the shards the next batches read, across window and epoch boundaries, up to a
horizon in bytes and never beyond the free part of the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset
from ferry.client.sampling.partition import rank_positions

BATCH = 8


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("prefetch") / "ds"), 300, shard_size=4096)


def _positions(j: int) -> np.ndarray:
    return rank_positions(0, j, BATCH, 1, 0)


def _walk(ds: TokenDataset, i: int, calls: int = 100) -> list[int]:
    submitted: list[int] = []
    ds._submit = submitted.extend  # type: ignore[method-assign]
    for _ in range(calls):  # the batch scan walks a few batches per call: as many calls as it takes
        ds.prefetch_ahead(("plan",), i, _positions)
    return submitted


def _first_read(ds: TokenDataset, i: int, horizon: int, depth: int = 1) -> list[int]:
    """Brute force: the shards of the batches after batch ``i`` in order of first read, up to the horizon."""
    seen: dict[int, None] = {}
    total, j = 0, i
    while (j - i < depth or total < horizon) and j - i < 1000:
        j += 1
        for s in ds.shards_of(_positions(j)):
            if s not in seen:
                seen[s] = None
                total += int(ds.manifest.shards.raw_bytes[s])
    return list(seen)


def _dataset(local: str, tmp_path: Path, shuffle: str, **kw: Any) -> TokenDataset:
    return TokenDataset(
        local, seq_len=32, seed=2, shuffle=shuffle, window=2, cache_dir=str(tmp_path / "c"), prefetch=1, **kw
    )


@pytest.mark.parametrize("shards_ahead", [1, 3, 12])
def test_a_global_shuffle_prefetches_the_next_batches_shards_in_order(
    local: str, tmp_path: Path, shards_ahead: int
) -> None:
    ds = _dataset(local, tmp_path, "global")
    shard = int(ds.manifest.shards.raw_bytes.max())
    ds.prefetch_bytes = shards_ahead * shard
    last = ds.num_samples // BATCH - 1  # the last batch of epoch 0: what comes next is epoch 1
    submitted = _walk(ds, last)
    assert submitted == _first_read(ds, last, shards_ahead * shard)
    ds.close()


@pytest.mark.parametrize("shuffle", ["window", "none"])
@pytest.mark.parametrize("shards_ahead", [1, 3, 12])
def test_windows_are_prefetched_by_the_order_across_epochs(
    local: str, tmp_path: Path, shuffle: str, shards_ahead: int
) -> None:
    ds = _dataset(local, tmp_path, shuffle)
    sizes = ds.manifest.shards.raw_bytes
    ds.prefetch_bytes = shards_ahead * int(sizes.max())
    last = ds.num_samples // BATCH - 1
    submitted = _walk(ds, last, calls=3)
    assert len(set(submitted)) == len(submitted)
    assert sum(int(sizes[s]) for s in submitted[:-2]) < ds.prefetch_bytes  # stops at the horizon (a shard + successor)
    needed = _first_read(ds, last, 0, depth=3)  # the next three batches, in epoch 1
    head = submitted[: len(needed) + 2 * ds.window + 2]
    assert set(needed) & set(head), (needed, submitted)
    if shards_ahead >= 3:  # past the current window (epoch 0's last): epoch 1's first batch is prefetched
        assert set(ds.shards_of(_positions(last + 1))) <= set(submitted)
    if shards_ahead == 12:  # more than the dataset: every shard
        assert sorted(submitted) == list(range(len(sizes)))
    ds.close()


def test_prefetch_never_exceeds_the_free_part_of_the_cache(local: str, tmp_path: Path) -> None:
    probe = _dataset(local, tmp_path / "p", "window")
    shard = int(probe.manifest.shards.raw_bytes.max())
    for shuffle in ("window", "global"):
        ds = _dataset(local, tmp_path / shuffle, shuffle, cache_limit=4 * shard, prefetch_bytes=100 * shard)
        submitted = _walk(ds, 0)
        sizes = ds.manifest.shards.raw_bytes
        assert sum(int(sizes[s]) for s in submitted[:-2]) < 4 * shard, shuffle  # the scan stops at the cache share
        assert len(submitted) < len(sizes), shuffle


def test_a_windows_own_shards_are_prefetched_before_their_successors(local: str, tmp_path: Path) -> None:
    """The first batch of a window reads its shards; a successor only serves the one sample that crosses a
    shard's end. Prefetched in the other order, the first batch waited for a successor's download."""
    apart = 0
    for seed in range(8):
        ds = TokenDataset(local, seq_len=32, seed=seed, shuffle="window", window=2, cache_dir=str(tmp_path / "c"))
        first = next(ds._groups(0, 0))  # the window of stream position 0
        apart += len(first) == 2 and abs(first[0] - first[1]) > 1  # its successors are other shards
        want = ds._coming_shards(0, 3 * int(ds.manifest.shards.raw_bytes.max()), set())
        assert set(want[: len(first)]) == set(first), (seed, first, want)
        ds.close()
    assert apart >= 2


def test_a_window_shuffle_keeps_mapped_only_what_its_window_reads(local: str, tmp_path: Path) -> None:
    """Shards of windows already read stay in the cache but not mapped: mapped (leased) shards cannot be
    evicted, so keeping them would leave the prefetch no room and its shards evicted before they are read."""
    ds = _dataset(local, tmp_path, "window")
    seen: set[int] = set()
    for j in range(ds.num_samples // BATCH):
        ds.payload(_positions(j))
        mapped = set(ds.reader._leases)
        seen |= mapped
        assert len(mapped) <= 2 * ds.window, (j, sorted(mapped))
    assert len(seen) == len(ds.manifest.shards) > 2 * ds.window  # the epoch went through every window
    ds.close()
