"""DataLoader workers of an epoch read to its end are kept for the next one (they keep their mapped shards, checked
cache files and threads): the same processes, the same batches as without workers, epoch after epoch."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.pipes import PIPE_BYTES


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("kept") / "ds"), 200)


def _epoch(loader: TokenLoader) -> list[torch.Tensor]:
    return [b["input_ids"] for b in loader]


def test_the_workers_of_a_finished_epoch_read_the_next_one(url: str, tmp_path: Path) -> None:
    alone = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c0")), batch_size=4)
    loader = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c")), 4, num_workers=2)
    pids: list[set[int]] = []
    for _ in range(3):
        expected, got = _epoch(alone), _epoch(loader)
        assert len(got) == len(expected) > 0
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))  # each epoch its own order
        pids.append({p.pid for p in multiprocessing.active_children()})
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]  # before: two new workers every epoch


def test_a_loaded_state_gets_new_workers_and_continues_exactly(url: str, tmp_path: Path) -> None:
    def make(cache: str) -> TokenLoader:
        return TokenLoader(TokenDataset(url, seq_len=16, seed=5, cache_dir=str(tmp_path / cache)), 4, num_workers=2)

    first = make("a")
    _epoch(first)  # workers kept
    it = iter(first)
    [next(it) for _ in range(3)]
    state = first.state_dict()
    rest = [b["input_ids"] for b in it]
    before = {p.pid for p in multiprocessing.active_children()}
    first.load_state_dict(state)  # back to the state: the kept workers go, new ones read on
    again = _epoch(first)
    assert all(torch.equal(a, b) for a, b in zip(again, rest, strict=True)) and len(again) == len(rest)
    after = {p.pid for p in multiprocessing.active_children()}
    assert len(after) == 2 and not before & after


def test_the_workers_send_their_batches_through_a_wide_pipe(url: str, tmp_path: Path) -> None:
    """An item of batches passes in one write: the result pipe has PIPE_BYTES of buffer, not 64 KiB."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_GETPIPE_SZ") or int(Path("/proc/sys/fs/pipe-max-size").read_text()) < PIPE_BYTES:
        pytest.skip("no pipe size to set here (Linux, pipe-max-size of at least 1 MiB)")
    loader = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c")), 4, num_workers=2)
    expected = _epoch(TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c0")), 4))
    assert all(torch.equal(a, b) for a, b in zip(_epoch(loader), expected, strict=True))
    kept = loader._kept
    assert kept is not None
    reader = kept.loader._iterator._worker_result_queue._reader  # type: ignore[union-attr]
    assert fcntl.fcntl(reader.fileno(), fcntl.F_GETPIPE_SZ) == PIPE_BYTES


def test_a_workers_item_holds_the_batches_that_fill_its_bytes(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first batch (alone), a worker sends as many batches per item as hold ``ITEM_BYTES`` of tokens
    (before: always 4, so large batches made items of several MiB, each received into fresh pages)."""
    import ferry.client.stream.loader as loader_module

    ds = TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c"))
    batch = 4 * 17 * np.dtype(ds.token_dtype).itemsize
    monkeypatch.setattr(loader_module, "ITEM_BYTES", 3 * batch + 1)
    sizes: list[int] = []
    received = TokenLoader._received

    def spy(self: TokenLoader, items: Any, *rest: Any) -> Any:
        def counted() -> Any:
            for item, grown in items:
                sizes.append(len(item))
                yield item, grown

        return received(self, counted(), *rest)

    monkeypatch.setattr(TokenLoader, "_received", spy)
    loader = TokenLoader(ds, 4, num_workers=2)
    expected = _epoch(TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c0")), 4))
    assert all(torch.equal(a, b) for a, b in zip(_epoch(loader), expected, strict=True))
    assert loader._group() == 3
    full = [n for n in sizes if n]  # an empty item carries only counters
    assert full[:2] == [1, 1] and set(full[2:-2]) == {3}, full  # each worker's first batch alone, then threes
    assert sum(full) == len(expected)
    big = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c")), 10**6)
    small = TokenLoader(TokenDataset(url, seq_len=2, seed=3, cache_dir=str(tmp_path / "c")), 1)
    assert big._group() == 1 and small._group() == loader_module._GROUP_MAX


def test_the_workers_windows_cross_in_shared_slots_and_batches_kept_stay_as_they_were(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forked workers put their windows in shared slots (ferry.client.slots), which are reused item after item:
    every batch kept from two epochs still equals the stream without workers (none is a view of a slot)."""
    from ferry.client.slots import Slots

    through: list[bool] = []
    windows = Slots.windows

    def spy(self: Slots, payload: Any) -> Any:
        through.append("slot" in payload)
        return windows(self, payload)

    monkeypatch.setattr(Slots, "windows", spy)
    alone = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c0")), batch_size=4)
    loader = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c")), 4, num_workers=2)
    expected = [b for _ in range(2) for b in _epoch(alone)]
    got = [b for _ in range(2) for b in _epoch(loader)]  # all kept until the end
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert len(through) == len(got)
    # at most P×W items of an epoch's end may find their worker's slots taken (the other worker ended first): the pipe
    assert sum(through) >= len(got) - 2 * loader.prefetch_factor * loader.num_workers * loader._group(), through


def test_workers_that_are_not_forked_send_their_batches_through_the_pipe(url: str, tmp_path: Path) -> None:
    """Workers started by ``spawn`` cannot share the slots' mapping: their items travel pickled, the same batches."""
    script = f"""
import multiprocessing, sys, torch
from ferry.client import TokenDataset, TokenLoader
from ferry.client import slots as S
if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    seen = []
    windows = S.Slots.windows
    S.Slots.windows = lambda self, p: seen.append("slot" in p) or windows(self, p)
    def make(workers, cache):
        return TokenLoader(TokenDataset({str(url)!r}, seq_len=16, seed=3, cache_dir=cache), 4, num_workers=workers)
    a = [b["input_ids"] for b in make(0, {str(tmp_path / "s0")!r})]
    b = [b["input_ids"] for b in make(2, {str(tmp_path / "s2")!r})]
    assert len(a) == len(b) == len(seen) > 0 and all(torch.equal(x, y) for x, y in zip(a, b)), (len(a), len(b))
    assert not any(seen), seen
    print("OK", len(b))
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stderr[-3000:]


def test_document_boundaries_stay_in_the_item_while_the_windows_cross_in_slots(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``return_doc_boundaries`` a payload holds windows and boundaries: the windows go into a slot, the
    boundaries travel in the item, and every tensor equals the one built without workers."""
    from ferry.client.slots import Slots

    keys: list[frozenset[str]] = []
    windows = Slots.windows

    def spy(self: Slots, payload: Any) -> Any:
        keys.append(frozenset(payload))
        return windows(self, payload)

    monkeypatch.setattr(Slots, "windows", spy)

    def make(workers: int, cache: str) -> TokenLoader:
        ds = TokenDataset(url, seq_len=16, seed=7, cache_dir=str(tmp_path / cache))
        return TokenLoader(ds, 4, num_workers=workers, return_doc_boundaries=True)

    expected, got = list(make(0, "c0")), list(make(2, "c2"))
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys() >= {"input_ids", "labels", "cu_seqlens", "position_ids"}
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert keys.count(frozenset({"slot", "boundaries"})) > len(got) // 2, keys


def test_slots_that_would_hold_more_than_their_bound_are_not_made(url: str, tmp_path: Path) -> None:
    """The slots stay mapped as long as the workers: huge batches or many workers use the pipe instead."""
    import ferry.client.stream.loader as loader_module

    ds = TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c"))
    small = TokenLoader(ds, 4, num_workers=2)._slots()
    assert small is not None and small.workers == 2 and small.per_worker == 2 + 2
    assert small.workers * small.per_worker * small.slot_bytes <= loader_module.SLOTS_MAX_BYTES
    batch = loader_module.SLOTS_MAX_BYTES // (17 * np.dtype(ds.token_dtype).itemsize) // 8 + 1
    assert TokenLoader(ds, batch, num_workers=2)._slots() is None  # 2 workers × 4 slots of one batch: over
    document = TokenDataset(url, seq_len=16, seed=3, cache_dir=str(tmp_path / "c"), mode="document")
    assert TokenLoader(document, 4, num_workers=2)._slots() is None
