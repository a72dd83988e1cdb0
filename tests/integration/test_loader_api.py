"""The public face of the loader: exported names, defaults, plain DataLoader use, no import of ``service``."""

from __future__ import annotations

import gc
import multiprocessing
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from scripts.loader_common import pack_test_dataset

from ferry import client
from ferry.client import TokenDataset, TokenLoader
from ferry.shard_tools.errors import UsageError


@pytest.fixture(scope="module")
def url_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("api")
    return pack_test_dataset(str(root / "ds"), 100), str(root / "cache")


def test_exported_names() -> None:
    assert {"TokenDataset", "MixedDataset", "TokenLoader"} <= set(client.__all__)
    for name in client.__all__:
        assert getattr(client, name) is not None


def test_client_never_imports_service() -> None:
    code = (
        "import sys, ferry.client; bad = [m for m in sys.modules if m.startswith('ferry.service')]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rank_and_world_size_come_from_the_environment(
    url_cache: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cache = url_cache
    ds = TokenDataset(url, seq_len=16, cache_dir=cache)
    assert (TokenLoader(ds, 2).rank, TokenLoader(ds, 2).world_size) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = TokenLoader(ds, 2)
    assert (loader.rank, loader.world_size, loader.global_batch_size) == (2, 4, 8)
    with pytest.raises(UsageError, match="invalid loader shape"):
        TokenLoader(ds, 2, rank=4, world_size=4)


def test_an_abandoned_iterator_stops_its_worker_processes_when_closed(url_cache: tuple[str, str]) -> None:
    """Leaving an epoch early (break, an exception, a checkpoint-and-exit) must not leave DataLoader
    workers waiting for work until interpreter exit."""
    url, cache = url_cache
    loader = TokenLoader(TokenDataset(url, seq_len=16, cache_dir=cache), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    workers = multiprocessing.active_children()
    assert len(workers) == 2
    holder: list[Any] = [it]
    holder.append(holder)  # a reference cycle: only an explicit close reaches the workers before gc
    gc.disable()
    try:
        it.close()  # type: ignore[attr-defined]
        for w in workers:
            w.join(timeout=10)
        assert not any(w.is_alive() for w in workers)
        assert loader.state_dict()["consumed"] == 2
    finally:
        gc.enable()


def test_a_worker_sends_its_first_batch_alone(url_cache: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers send batches in groups, but the first goes alone: a cold start waits for one batch, not for
    a group whose later batches may wait on whole shards being fetched (here: made slow on purpose)."""

    url, _ = url_cache
    payload = TokenDataset.planned_payload

    def slow_after_the_first(self: TokenDataset, key: Any, i: int, positions_of: Any, **kw: Any) -> Any:
        if int(np.min(positions_of(i))) >= 8:  # every batch but the first (batch_size 8, one rank)
            time.sleep(0.8)
        return payload(self, key, i, positions_of, **kw)

    monkeypatch.setattr(TokenDataset, "planned_payload", slow_after_the_first)  # inherited by the forked worker
    ds = TokenDataset(url, seq_len=16, seed=1, shuffle="window", window=2)
    loader = TokenLoader(ds, batch_size=8, num_workers=1, rank=0, world_size=1)
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    del it
    assert first < 1.6, f"the first batch took {first:.2f} s: it waited for the slow batches of its group"


def test_with_workers_a_loop_with_a_step_finds_its_batches_received_during_the_step(
    url_cache: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Receiving a worker's item and making its tensors is work the loop would wait on in ``next()``: while the
    loop runs its step the helper thread does it; a loop that asks back to back does it itself (a hand-over
    between threads would cost it more). The batches are the same as without workers."""
    import ferry.client.stream.loader as loader_module

    url, cache = url_cache
    threads: list[str] = []
    real = loader_module.to_batch

    def spy(payload: Any, **options: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(payload, **options)

    monkeypatch.setattr(loader_module, "to_batch", spy)
    with_step = []
    for batch in TokenLoader(TokenDataset(url, seq_len=16, cache_dir=cache, seed=3), batch_size=4, num_workers=2):
        with_step.append(batch["input_ids"])
        if len(with_step) <= 10:
            time.sleep(0.05)  # a step: the next batch is received meanwhile
    assert "ferry-idle" in threads[1:10], threads[:10]
    threads.clear()
    ds = TokenDataset(url, seq_len=16, cache_dir=cache, seed=3)
    back_to_back = [b["input_ids"] for b in TokenLoader(ds, batch_size=4, num_workers=2)]
    assert threading.current_thread().name in threads
    alone = [b["input_ids"] for b in TokenLoader(TokenDataset(url, seq_len=16, cache_dir=cache, seed=3), batch_size=4)]
    assert len(with_step) == len(back_to_back) == len(alone) > 10
    assert all(torch.equal(a, b) for a, b in zip(with_step, alone, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(back_to_back, alone, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_shared_labels_give_the_same_batches_as_views_of_one_buffer(url_cache: tuple[str, str], workers: int) -> None:
    """``shared_labels``: the same values as the default's two tensors, with boundaries too, but input_ids and
    labels overlap in one widened buffer: labels[:, j] is input_ids[:, j + 1] in memory."""
    url, cache = url_cache
    ds = TokenDataset(url, seq_len=16, seed=3, cache_dir=cache)
    default = TokenLoader(ds, 4, return_doc_boundaries=True)
    plain = [(b["input_ids"], b["labels"], b["position_ids"]) for b in default]
    loader = TokenLoader(ds, 4, num_workers=workers, shared_labels=True, return_doc_boundaries=True)
    shared = list(loader)
    assert len(shared) == len(plain) > 3
    assert loader.state_dict() == default.state_dict()  # the same run: either loads the other's state
    for (ids, labels, pos), batch in zip(plain, shared, strict=True):
        assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["labels"], labels)
        assert torch.equal(batch["position_ids"], pos)
        assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
        assert batch["labels"].data_ptr() == batch["input_ids"].data_ptr() + 8
        assert batch["input_ids"].stride() == batch["labels"].stride() == (17, 1)
    batch = shared[0]
    batch["labels"][:, 0] = -5  # a change in place shows through the other view
    assert (batch["input_ids"][:, 1] == -5).all()
    assert not (plain[0][1][:, 0] == -5).all()


def test_shared_labels_are_refused_in_document_mode_and_checked(url_cache: tuple[str, str]) -> None:
    url, cache = url_cache
    with pytest.raises(UsageError, match="shared_labels needs mode='tokens'"):
        TokenLoader(TokenDataset(url, seq_len=16, mode="document", cache_dir=cache), 2, shared_labels=True)
    with pytest.raises(UsageError, match="shared_labels"):
        TokenLoader(TokenDataset(url, seq_len=16, cache_dir=cache), 2, shared_labels="yes")  # type: ignore[arg-type]


def test_pinned_shared_labels_stay_views_of_one_pinned_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinning copies the two overlapping views into one buffer (this machine has no CUDA: pinned memory is
    stood in for by plain memory, and which tensors were pinned is recorded)."""
    from ferry.client.stream import loader as loader_module

    pinned: list[tuple[int, ...]] = []
    real_empty = torch.empty

    def empty(*shape: Any, pin_memory: bool = False, **kw: Any) -> torch.Tensor:
        pinned.append(tuple(shape[0]))
        assert pin_memory
        return real_empty(*shape, **kw)

    monkeypatch.setattr(loader_module.torch, "empty", empty)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(tuple(t.shape)) or t.clone())
    both = np.arange(2 * 5, dtype=np.int64).reshape(2, 5)
    batch = {
        "input_ids": torch.from_numpy(both[:, :-1]),
        "labels": torch.from_numpy(both[:, 1:]),
        "position_ids": torch.zeros(2, 4, dtype=torch.int64),
    }
    out = loader_module._pin(batch, True)
    assert pinned == [(2, 4), (2, 5)]  # position_ids, then the one buffer of both views
    assert torch.equal(out["input_ids"], batch["input_ids"]) and torch.equal(out["labels"], batch["labels"])
    assert out["labels"].data_ptr() == out["input_ids"].data_ptr() + 8
    assert out["input_ids"].data_ptr() != batch["input_ids"].data_ptr()


def test_shared_labels_over_a_mixture(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A mixture's batches are windows too: the same values as its default loader's, in one buffer, with workers
    and without."""
    root = tmp_path_factory.mktemp("mix")
    cache = str(root / "cache")
    urls = [pack_test_dataset(str(root / name), 100, seed=seed) for name, seed in (("a", 1), ("b", 2))]
    parts = [TokenDataset(url, seq_len=16, cache_dir=cache) for url in urls]
    mix = TokenDataset.mix(parts, weights=[0.5, 0.5])
    plain = [b["labels"] for b in TokenLoader(mix, 4)]
    for workers in (0, 2):
        shared = list(TokenLoader(mix, 4, num_workers=workers, shared_labels=True))
        assert len(shared) == len(plain) > 3
        assert all(torch.equal(p, s["labels"]) for p, s in zip(plain, shared, strict=True))
        assert all(s["labels"].data_ptr() == s["input_ids"].data_ptr() + 8 for s in shared)
