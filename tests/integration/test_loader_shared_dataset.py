"""Loaders that share one dataset object (ranks simulated in one process, a train and an eval loop) each get the
batches they get alone: what the dataset plans for one loader's coming batches never serves another's."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from scripts.loader_common import pack_test_dataset, token_stream

from ferry.client import TokenDataset, TokenLoader

SEQ = 16


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("shared") / "ds"), 300)  # small shards: samples cross


def _ids(loader: TokenLoader, count: int) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    while len(out) < count:
        out.extend(b["input_ids"] for b in loader)
    return out[:count]


def _alone(url: str, cache: Path, batch: int, rank: int, world: int, count: int) -> list[torch.Tensor]:
    ds = TokenDataset(url, seq_len=SEQ, seed=3, cache_dir=str(cache))
    return _ids(TokenLoader(ds, batch_size=batch, rank=rank, world_size=world), count)


@pytest.mark.parametrize("shuffle", ["global", "window"])
def test_interleaved_loaders_on_one_dataset_get_their_own_batches(url: str, tmp_path: Path, shuffle: str) -> None:
    ds = TokenDataset(url, seq_len=SEQ, seed=3, shuffle=shuffle, window=2, cache_dir=str(tmp_path / "c"))
    shapes = [(4, 0, 1), (6, 0, 1), (4, 0, 2), (4, 1, 2)]  # batch, rank, world
    loaders = [TokenLoader(ds, batch_size=b, rank=r, world_size=w) for b, r, w in shapes]
    iters = [iter(ld) for ld in loaders]
    got: list[list[torch.Tensor]] = [[] for _ in loaders]
    for _ in range(min(len(ld) for ld in loaders)):
        for k, it in enumerate(iters):
            got[k].append(next(it)["input_ids"])
    for k, (b, r, w) in enumerate(shapes):
        alone = TokenDataset(url, seq_len=SEQ, seed=3, shuffle=shuffle, window=2, cache_dir=str(tmp_path / "c"))
        expected = _ids(TokenLoader(alone, batch_size=b, rank=r, world_size=w), len(got[k]))
        assert all(torch.equal(a, e) for a, e in zip(got[k], expected, strict=True)), f"loader {k} ({b}, {r}/{w})"
    # and the rows are the stream's samples (the oracle, read without the loader)
    stream = token_stream(url)
    ids = ds.sample_ids(np.arange(6 * len(got[1])))
    rows = np.stack([stream[i * SEQ : i * SEQ + SEQ] for i in ids.tolist()])
    np.testing.assert_array_equal(torch.cat(got[1]).numpy(), rows)


def test_a_resumed_loader_beside_a_running_one(url: str, tmp_path: Path) -> None:
    ds = TokenDataset(url, seq_len=SEQ, seed=3, cache_dir=str(tmp_path / "c"))
    first = TokenLoader(ds, batch_size=4)
    it = iter(first)
    head = [next(it)["input_ids"] for _ in range(7)]
    state = first.state_dict()
    second = TokenLoader(ds, batch_size=4)
    second.load_state_dict(state)
    tail_second = [b["input_ids"] for _, b in zip(range(5), second, strict=False)]
    tail_first = [next(it)["input_ids"] for _ in range(5)]
    expected = _alone(url, tmp_path / "a", 4, 0, 1, 12)
    assert all(torch.equal(a, e) for a, e in zip(head + tail_first, expected, strict=True))
    assert all(torch.equal(a, e) for a, e in zip(tail_second, expected[7:], strict=True))


def test_loaders_in_two_threads_on_one_dataset(url: str, tmp_path: Path) -> None:
    ds = TokenDataset(url, seq_len=SEQ, seed=3, cache_dir=str(tmp_path / "c"))
    got: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def run(batch: int) -> None:
        try:
            got[batch] = _ids(TokenLoader(ds, batch_size=batch), 3 * len(TokenLoader(ds, batch_size=batch)))
        except BaseException as exc:  # noqa: BLE001 — the test's to see
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(b,)) for b in (3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    for batch, rows in got.items():
        expected = _alone(url, tmp_path / f"a{batch}", batch, 0, 1, len(rows))
        assert all(torch.equal(a, e) for a, e in zip(rows, expected, strict=True)), f"batch {batch}"
