"""Mixing: exact proportions over every prefix (±1 per source), pure per position (a mixture as a source,
resumable and deterministic: tests/integration/test_mixture_sources.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripts.loader_common import pack_test_dataset, token_stream

from ferry.client import TokenDataset, TokenLoader
from ferry.client.sampling.mixing import MAX_PERIOD, MixSchedule
from ferry.shard_tools.errors import UsageError


@settings(max_examples=150, deadline=None)
@given(weights=st.lists(st.floats(1.0, 100.0), min_size=1, max_size=6))
def test_every_prefix_is_within_one_sample_of_the_weights(weights: list[float]) -> None:
    m = MixSchedule(weights)
    assert m.period <= MAX_PERIOD
    t = np.arange(1, 2 * m.period + 1)
    src, idx = m.locate(np.arange(2 * m.period))
    eff = np.asarray(m.weights)
    for j in range(len(weights)):
        counts = np.cumsum(src == j)
        assert np.abs(counts - t * eff[j]).max() <= 1.0
        # the index within a source counts up by one each time that source is drawn
        np.testing.assert_array_equal(idx[src == j], np.arange(int(counts[-1])))
    # the effective weights are the requested ones up to the period's resolution
    np.testing.assert_allclose(eff, np.asarray(weights) / sum(weights), atol=2.0 / m.period)


@settings(max_examples=50, deadline=None)
@given(weights=st.lists(st.integers(1, 20), min_size=1, max_size=5), data=st.data())
def test_a_position_is_located_without_its_prefix(weights: list[int], data: st.DataObject) -> None:
    m = MixSchedule(weights)
    p = data.draw(st.integers(0, 10**15))
    src, idx = m.locate(np.asarray([p]))
    cycle, off = divmod(p, m.period)
    s_all, i_all = m.locate(np.arange(m.period))
    assert int(src[0]) == int(s_all[off])
    assert int(idx[0]) == cycle * int(m.quota[src[0]]) + int(i_all[off])


def test_bad_weights_are_usage_errors() -> None:
    with pytest.raises(ValueError):
        MixSchedule([1.0, 0.0])
    with pytest.raises(ValueError):
        MixSchedule([])


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    root = tmp_path_factory.mktemp("mix")
    a = pack_test_dataset(str(root / "a"), 200, seed=1)
    b = pack_test_dataset(str(root / "b"), 120, seed=2)
    return a, b, str(root / "cache")


def _mixed(two: tuple[str, str, str], seed_a: int = 1) -> tuple[TokenDataset, TokenDataset, object]:
    a, b, cache = two
    da = TokenDataset(a, seq_len=16, seed=seed_a, cache_dir=cache)
    db = TokenDataset(b, seq_len=16, seed=2, cache_dir=cache, shuffle="window", window=2)
    return da, db, TokenDataset.mix([da, db], weights=[0.7, 0.3])


def test_mixed_batches_draw_each_source_in_its_own_order(two: tuple[str, str, str]) -> None:
    da, db, mixed = _mixed(two)
    loader = TokenLoader(mixed, batch_size=10, rank=0, world_size=1)  # type: ignore[arg-type]
    rows = np.concatenate([b["input_ids"].numpy() for _, b in zip(range(30), loader, strict=False)])
    sa, sb = token_stream(two[0]), token_stream(two[1])
    ia, ib = da.sample_ids(np.arange(210)), db.sample_ids(np.arange(90))
    expect_a = np.stack([sa[i * 16 : i * 16 + 16] for i in ia])
    expect_b = np.stack([sb[i * 16 : i * 16 + 16] for i in ib])
    np.testing.assert_array_equal(rows[0::10][:3], np.stack([expect_a[0], expect_a[7], expect_a[14]]))
    src, idx = mixed.schedule.locate(np.arange(300))  # type: ignore[attr-defined]
    assert (src == 0).sum() == 210 and (src == 1).sum() == 90
    np.testing.assert_array_equal(rows[src == 0], expect_a[idx[src == 0]])
    np.testing.assert_array_equal(rows[src == 1], expect_b[idx[src == 1]])


def test_mixing_needs_matching_seq_len(two: tuple[str, str, str]) -> None:
    a, b, cache = two
    with pytest.raises(UsageError, match="seq_len"):
        TokenDataset.mix([TokenDataset(a, 16, cache_dir=cache), TokenDataset(b, 32, cache_dir=cache)], [1, 1])
