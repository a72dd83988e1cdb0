"""``MapStyleView`` + ``StreamSampler`` in a plain ``DataLoader`` give TokenLoader's batches, state and resume
(for every kind of source, indexing by stream position included: tests/contracts/sources.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from scripts.loader_common import pack_test_dataset
from torch.utils.data import DataLoader

from ferry.client import TokenDataset, TokenLoader
from ferry.client.integrations import MapStyleView, StreamSampler
from ferry.shard_tools.errors import UsageError

SEQ = 64


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    url = pack_test_dataset(str(tmp_path_factory.mktemp("map") / "ds"), 120)
    return TokenDataset(url, seq_len=SEQ, seed=5, cache_dir=str(tmp_path_factory.mktemp("cache")))


def _map_loader(ds: Any, batch: int, rank: int, world: int, workers: int = 0, **view: Any) -> DataLoader:
    sampler = StreamSampler(ds, batch, rank=rank, world_size=world)
    return DataLoader(MapStyleView(ds, **view), sampler=sampler, batch_size=batch, num_workers=workers)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(("rank", "world", "workers"), [(0, 1, 0), (2, 3, 0), (1, 2, 2)])
def test_dataloader_over_the_view_gives_tokenloaders_batches(
    ds: TokenDataset, rank: int, world: int, workers: int
) -> None:
    loader = _map_loader(ds, 4, rank, world, workers)
    ref = TokenLoader(ds, 4, rank=rank, world_size=world)
    for _epoch in range(2):  # the second iter() continues into the next epoch, as TokenLoader's does
        assert len(loader) == len(ref)
        got, want = list(loader), list(ref)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)
    assert loader.sampler.state_dict() == ref.state_dict()  # type: ignore[attr-defined]


def test_position_ids_match_the_loaders(ds: TokenDataset) -> None:
    got = next(iter(_map_loader(ds, 4, 0, 1, position_ids=True)))
    want = next(iter(TokenLoader(ds, 4, return_doc_boundaries=True)))
    assert set(got) == {"input_ids", "labels", "position_ids"}
    assert torch.equal(got["position_ids"], want["position_ids"])
    assert torch.equal(got["input_ids"], want["input_ids"])


def test_position_ids_need_token_mode(tmp_path: Path) -> None:
    url = pack_test_dataset(str(tmp_path / "b"), 60, seed=1)
    docs = TokenDataset(url, seq_len=SEQ, mode="document", cache_dir=str(tmp_path / "c"))
    with pytest.raises(UsageError, match="position_ids needs mode='tokens'"):
        MapStyleView(docs, position_ids=True)


def _tracked(sampler: StreamSampler, loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from sampler.track(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_tracked_state_resumes_on_another_world_size(ds: TokenDataset, workers: int) -> None:
    # 2 ranks of batch 4 deliver 30 batches (past one epoch), checkpoint; 1 rank of batch 8 resumes
    steps, more = 30, 12
    ref = TokenLoader(ds, 8)
    want = [b["input_ids"] for _, b in zip(range(steps + more), _forever(ref), strict=False)]
    samplers = [StreamSampler(ds, 4, rank=r, world_size=2) for r in range(2)]
    views = [DataLoader(MapStyleView(ds), sampler=s, batch_size=4, num_workers=workers) for s in samplers]
    gens = [_tracked(s, v) for s, v in zip(samplers, views, strict=True)]
    try:
        for k in range(steps):
            got = torch.cat([next(g)["input_ids"] for g in gens])
            assert torch.equal(got, want[k]), f"step {k}"
        states = [s.state_dict() for s in samplers]
    finally:
        for g in gens:
            g.close()
    # workers fetched batches ahead; the state counts only those the loop received
    assert states[0] == states[1]
    fresh = TokenLoader(ds, 8)
    for _, _b in zip(range(steps), _forever(fresh), strict=False):
        pass
    assert states[0] == fresh.state_dict(), "the sampler's state is TokenLoader's"
    resumed = StreamSampler(ds, 8)
    resumed.load_state_dict(json.loads(json.dumps(states[0])))
    tail = DataLoader(MapStyleView(ds), sampler=resumed, batch_size=8)
    got_tail = [b["input_ids"] for _, b in zip(range(more), _tracked(resumed, tail), strict=False)]
    for k, batch in enumerate(got_tail, start=steps):
        assert torch.equal(batch, want[k]), f"step {k} after the resume"
    # and a TokenLoader takes the sampler's state
    loader = TokenLoader(ds, 8)
    loader.load_state_dict(states[0])
    assert torch.equal(next(iter(loader))["input_ids"], want[steps])


def _forever(loader: TokenLoader) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from loader


def test_sampler_checks(ds: TokenDataset) -> None:
    sampler = StreamSampler(MapStyleView(ds), 4)  # a view stands for its dataset
    assert sampler.dataset is ds and len(sampler) == len(TokenLoader(ds, 4)) * 4
    wrong = DataLoader(MapStyleView(ds), sampler=sampler, batch_size=2)
    with pytest.raises(UsageError, match="batch_size=4"):
        next(iter(sampler.track(wrong)))
    with pytest.raises(UsageError, match="rank=2 is not below world_size=2"):
        StreamSampler(ds, 4, rank=2, world_size=2)
    with pytest.raises(UsageError, match="batch_size"):
        StreamSampler(ds, 0)
    with pytest.raises(UsageError, match="TokenDataset"):
        StreamSampler([1, 2, 3], 4)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="TokenDataset"):
        MapStyleView(range(3))  # type: ignore[arg-type]
