"""Mixtures keep the contract every source keeps (tests/contracts/sources.py): a plain weighted mixture and a
scheduled one (its "early" resume stops inside a phase). Each oracle reads the sources alone at the
positions the schedule locates."""

from __future__ import annotations

import numpy as np
import pytest
from contracts.sources import Make, SampleSourceContract
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset
from ferry.client.sampling.schedule import Schedule
from ferry.client.source import SampleSource
from ferry.client.stream.mixed import MixedDataset

SEQ = 16
PHASES = [(0, [1, 1, 0]), (50, [1, 2, 1]), (130, [0, 1, 3])]


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    root = tmp_path_factory.mktemp("mixtures")
    sizes = [("a", 200), ("b", 120), ("c", 60)]
    return [pack_test_dataset(str(root / n), d, seed=i + 1) for i, (n, d) in enumerate(sizes)], str(root / "cache")


def _read_alone(source: MixedDataset, schedule: Schedule, positions: np.ndarray) -> dict[str, np.ndarray]:
    src, idx = schedule.locate(positions)
    rows = np.zeros((len(positions), source.seq_len), dtype=np.int64)
    for j, d in enumerate(source.sources):
        if (src == j).any():
            rows[src == j] = d.batch(idx[src == j])["input_ids"].numpy()
    return {"input_ids": rows}


class TestWeightedMixture(SampleSourceContract):
    """Two sources, one shuffled globally and one by windows; another seed of the first is another order."""

    @pytest.fixture
    def make(self, urls: tuple[list[str], str]) -> Make:
        (a, b, _), cache = urls

        def make(seed: int) -> SampleSource:
            first = TokenDataset(a, seq_len=SEQ, seed=seed, cache_dir=cache)
            second = TokenDataset(b, seq_len=SEQ, seed=2, cache_dir=cache, shuffle="window", window=2)
            return TokenDataset.mix([first, second], weights=[0.7, 0.3])

        return make

    def expected(self, source: SampleSource, positions: np.ndarray) -> dict[str, np.ndarray]:
        assert isinstance(source, MixedDataset)
        plain = Schedule.from_weights([(0, [0.7, 0.3])])  # one phase: the plain mixture
        return _read_alone(source, plain, positions)


class TestScheduledMixture(SampleSourceContract):
    """Three sources over three phases."""

    @pytest.fixture
    def make(self, urls: tuple[list[str], str]) -> Make:
        paths, cache = urls
        return lambda seed: TokenDataset.mix(
            [TokenDataset(u, seq_len=SEQ, seed=seed + i, cache_dir=cache) for i, u in enumerate(paths)], PHASES
        )

    def expected(self, source: SampleSource, positions: np.ndarray) -> dict[str, np.ndarray]:
        assert isinstance(source, MixedDataset)
        return _read_alone(source, Schedule.from_weights(PHASES), positions)
