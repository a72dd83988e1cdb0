"""StreamSampler.track as a careless operator wires it: a DataLoader that hands over single samples
(``batch_size=None``) must be refused, not counted a batch each (a state that skips samples on resume)."""

from __future__ import annotations

import pytest
from scripts.loader_common import pack_test_dataset
from torch.utils.data import DataLoader

from ferry.client import TokenDataset
from ferry.client.integrations import MapStyleView, StreamSampler
from ferry.shard_tools.errors import UsageError


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    url = pack_test_dataset(str(tmp_path_factory.mktemp("ms") / "ds"), 200)
    return TokenDataset(url, seq_len=16, cache_dir=str(tmp_path_factory.mktemp("cache")))


def test_single_samples_from_the_dataloader_are_refused(ds: TokenDataset) -> None:
    sampler = StreamSampler(ds, 4, rank=0, world_size=1)
    batches = sampler.track(DataLoader(MapStyleView(ds), sampler=sampler, batch_size=None))
    with pytest.raises(UsageError, match="batch_size=4"):
        next(batches)
    assert sampler.position == 0  # nothing was counted


def test_batches_of_the_samplers_size_are_counted(ds: TokenDataset) -> None:
    sampler = StreamSampler(ds, 4, rank=0, world_size=1)
    batches = sampler.track(DataLoader(MapStyleView(ds), sampler=sampler, batch_size=4))
    for _ in range(3):
        assert next(batches)["input_ids"].shape == (4, 16)
    assert sampler.position == 12
