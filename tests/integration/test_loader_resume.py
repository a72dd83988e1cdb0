"""The resume test: interrupted + resumed == uninterrupted, sample for sample, for a ``TokenDataset`` in
token mode (and the contract every source keeps, tests/contracts/sources.py, for its shuffle modes).

Ranks are simulated in one process (one TokenLoader per rank); the global batch of a
step is the ranks' batches concatenated in rank order. Streams are compared as rows
(one row = one sample's ``input_ids``), across epoch boundaries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from contracts.sources import Make, SampleSourceContract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripts.loader_common import pack_test_dataset, token_stream

from ferry.client import TokenDataset, TokenLoader
from ferry.client.source import SampleSource
from ferry.shard_tools.errors import StateError

SEQ = 64


@pytest.fixture(scope="module")
def dataset_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    # ~17k tokens in ~9 shards: N = 268 samples of 64 tokens, samples cross shard boundaries
    return pack_test_dataset(str(tmp_path_factory.mktemp("resume") / "ds"), 400)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def _forever(loader: TokenLoader) -> Iterator[dict]:
    while True:
        yield from loader


def run_global(
    ds: TokenDataset, world: int, batch: int, workers: int, steps: int, state: dict | None = None
) -> tuple[list[np.ndarray], dict]:
    """``steps`` global batches as rows, and the state after them (identical on every rank)."""
    loaders = [TokenLoader(ds, batch, workers, rank=r, world_size=world) for r in range(world)]
    if state is not None:
        for ld in loaders:
            ld.load_state_dict(json.loads(json.dumps(state)))  # the state survives JSON
    gens = [_forever(ld) for ld in loaders]
    rows: list[np.ndarray] = []
    try:
        for _ in range(steps):
            for gen in gens:
                rows.extend(next(gen)["input_ids"].numpy())
    finally:
        for gen in gens:
            gen.close()  # stops DataLoader workers
    states = [ld.state_dict() for ld in loaders]
    assert all(s == states[0] for s in states)
    return rows, states[0]


def reference(ds: TokenDataset, count: int) -> np.ndarray:
    rows, _ = run_global(ds, 1, count, 0, 1)
    return np.stack(rows)


@pytest.mark.parametrize("shuffle", ["global", "window", "none"])
def test_uninterrupted_stream_is_the_epoch_permutations_of_the_samples(
    dataset_url: str, cache_dir: str, shuffle: str
) -> None:
    ds = TokenDataset(dataset_url, seq_len=SEQ, seed=7, shuffle=shuffle, cache_dir=cache_dir, window=2)
    n = ds.num_samples
    stream = token_stream(dataset_url)
    assert n == (len(stream) - 1) // SEQ
    rows = reference(ds, 2 * n + 5)
    everything = np.stack([stream[i * SEQ : i * SEQ + SEQ] for i in range(n)])
    for e in range(2):
        ids = ds.sample_ids(np.arange(e * n, (e + 1) * n))
        assert sorted(ids.tolist()) == list(range(n))  # every sample exactly once per epoch
        np.testing.assert_array_equal(rows[e * n : (e + 1) * n], everything[ids])
    if shuffle != "none":
        assert not np.array_equal(rows[:n], rows[n : 2 * n])  # a new order each epoch
    else:
        np.testing.assert_array_equal(rows[:n], everything)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shuffle=st.sampled_from(["global", "window", "none"]),
    g_factor=st.sampled_from([(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]),
    g_factor2=st.sampled_from([(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]),
    workers=st.sampled_from([0, 0, 0, 1, 2]),
    workers2=st.sampled_from([0, 0, 0, 1, 2]),
    stop=st.integers(0, 30),
    more=st.integers(1, 30),
    seed=st.integers(0, 2**32),
)
def test_resume_equals_uninterrupted(
    dataset_url: str,
    cache_dir: str,
    shuffle: str,
    g_factor: tuple[int, int],
    g_factor2: tuple[int, int],
    workers: int,
    workers2: int,
    stop: int,
    more: int,
    seed: int,
) -> None:
    """W→W', K→K' with the global batch kept (12); up to 60 steps of 12 = 720 samples ≈ 2.7 epochs."""
    if workers and workers2:
        workers2 = 0  # keep the example cheap on 2 cores: worker processes on one side is enough
    ds = TokenDataset(dataset_url, seq_len=SEQ, seed=seed, shuffle=shuffle, cache_dir=cache_dir, window=3)
    (w1, b1), (w2, b2) = g_factor, g_factor2
    first, state = run_global(ds, w1, b1, workers, stop)
    assert state["epoch"] * ds.num_samples + state["consumed"] == 12 * stop
    fresh = TokenDataset(dataset_url, seq_len=SEQ, seed=seed, shuffle=shuffle, cache_dir=cache_dir, window=3)
    second, _ = run_global(fresh, w2, b2, workers2, more, state)
    expected = reference(ds, 12 * (stop + more))
    np.testing.assert_array_equal(np.stack(first + second), expected)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    world=st.integers(1, 4),
    batch=st.integers(1, 9),
    world2=st.integers(1, 4),
    batch2=st.integers(1, 9),
    stop=st.integers(0, 40),
    more=st.integers(1, 40),
)
def test_changing_the_global_batch_repeats_and_skips_nothing(
    dataset_url: str, cache_dir: str, world: int, batch: int, world2: int, batch2: int, stop: int, more: int
) -> None:
    ds = TokenDataset(dataset_url, seq_len=SEQ, seed=11, shuffle="global", cache_dir=cache_dir)
    first, state = run_global(ds, world, batch, 0, stop)
    second, _ = run_global(ds, world2, batch2, 0, more, state)
    got = first + second
    np.testing.assert_array_equal(np.stack(got), reference(ds, len(got)))


def test_state_mismatch_is_a_clear_error(dataset_url: str, cache_dir: str, tmp_path: Path) -> None:
    ds = TokenDataset(dataset_url, seq_len=SEQ, seed=3, cache_dir=cache_dir)
    loader = TokenLoader(ds, batch_size=4, rank=0, world_size=1)
    next(iter(loader))
    state = loader.state_dict()

    reseeded = TokenDataset(dataset_url, seq_len=SEQ, seed=4, cache_dir=cache_dir)
    other_seed = TokenLoader(reseeded, 4, rank=0, world_size=1)
    with pytest.raises(StateError, match="seed"):
        other_seed.load_state_dict(state)
    other_len = TokenLoader(TokenDataset(dataset_url, seq_len=32, seed=3, cache_dir=cache_dir), 4, rank=0, world_size=1)
    with pytest.raises(StateError, match="seq_len"):
        other_len.load_state_dict(state)
    other_url = pack_test_dataset(str(tmp_path / "other"), 300, seed=9)
    other_ds = TokenLoader(TokenDataset(other_url, seq_len=SEQ, seed=3, cache_dir=cache_dir), 4, rank=0, world_size=1)
    with pytest.raises(StateError, match="dataset_version"):
        other_ds.load_state_dict(state)
    windowed = TokenDataset(dataset_url, seq_len=SEQ, seed=3, cache_dir=cache_dir, shuffle="window")
    with pytest.raises(StateError, match="shuffle mode"):
        TokenLoader(windowed, 4, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(StateError, match="lacks"):
        loader.load_state_dict({"epoch": 0})
    with pytest.raises(StateError, match="version"):
        loader.load_state_dict({**state, "version": 99})

    other_seed.load_state_dict(state, strict=False)  # explicitly overridden: continue at the same counter
    assert other_seed.position == 4


class TestTokenDatasetGlobalShuffle(SampleSourceContract):
    shuffle = "global"

    @pytest.fixture
    def make(self, dataset_url: str, cache_dir: str) -> Make:
        return lambda seed: TokenDataset(
            dataset_url, seq_len=SEQ, seed=seed, shuffle=self.shuffle, cache_dir=cache_dir, window=2
        )

    def expected(self, source: SampleSource, positions: np.ndarray) -> dict[str, np.ndarray]:
        assert isinstance(source, TokenDataset) and source.url is not None
        stream = token_stream(source.url)
        windows = np.stack([stream[i * SEQ : i * SEQ + SEQ + 1] for i in source.sample_ids(positions).tolist()])
        return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}

    def test_the_state_names_what_fixes_the_order(self, source: SampleSource) -> None:
        loader = TokenLoader(source, batch_size=3, rank=0, world_size=1)
        next(iter(loader))
        assert set(loader.state_dict()) == {
            "version", "dataset_version", "seed", "seq_len", "epoch", "consumed", "fingerprint"
        }  # fmt: skip


class TestTokenDatasetWindowShuffle(TestTokenDatasetGlobalShuffle):
    shuffle = "window"
