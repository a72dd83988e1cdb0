"""Property tests of the partition math, and of the loader's independence of ``num_workers``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.sampling.partition import batches_until, rank_positions, split_stream, worker_batches


@settings(max_examples=300, deadline=None)
@given(
    world=st.integers(1, 64),
    batch=st.integers(1, 64),
    start=st.integers(0, 10**12),
    k=st.integers(0, 10**6),
)
def test_ranks_are_disjoint_and_cover_the_global_batch(world: int, batch: int, start: int, k: int) -> None:
    g = world * batch
    parts = [rank_positions(start, k, batch, world, r) for r in range(world)]
    together = np.concatenate(parts)
    np.testing.assert_array_equal(together, np.arange(start + k * g, start + (k + 1) * g))
    assert len(set(together.tolist())) == g


@settings(max_examples=300, deadline=None)
@given(count=st.integers(0, 500), workers=st.integers(0, 16))
def test_workers_split_every_batch_exactly_once(count: int, workers: int) -> None:
    shares = [list(worker_batches(count, workers, w)) for w in range(max(1, workers))]
    assert sorted(k for share in shares for k in share) == list(range(count))


@settings(max_examples=200, deadline=None)
@given(start=st.integers(0, 10**9), length=st.integers(0, 10**6), world=st.integers(1, 32), batch=st.integers(1, 32))
def test_batches_until_reaches_the_end_and_no_further(start: int, length: int, world: int, batch: int) -> None:
    g = world * batch
    k = batches_until(start, start + length, batch, world)
    assert start + k * g >= start + length
    assert k == 0 or start + (k - 1) * g < start + length


def test_split_stream() -> None:
    epoch, pos = split_stream(np.array([0, 9, 10, 25]), 10)
    assert epoch.tolist() == [0, 0, 1, 2] and pos.tolist() == [0, 9, 0, 5]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("part")
    return pack_test_dataset(str(root / "ds"), 150), str(root / "cache")


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on a 2-core box
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_stream_never_depends_on_num_workers(small: tuple[str, str], workers: int) -> None:
    url, cache = small
    ds = TokenDataset(url, seq_len=32, seed=4, cache_dir=cache, shuffle="window", window=2)
    base = [b["input_ids"] for b in TokenLoader(ds, batch_size=5, num_workers=0, rank=1, world_size=3)]
    got = [b["input_ids"] for b in TokenLoader(ds, batch_size=5, num_workers=workers, rank=1, world_size=3)]
    assert len(got) == len(base) > 3
    for a, b in zip(base, got, strict=True):
        assert bool((a == b).all())
