"""The one owner of a process's background shard fetches: what it asks the cache for, when, and what settling
leaves behind."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset
from ferry.client.fetching import prefetcher
from ferry.client.fetching.cache import ShardCache
from ferry.shard_tools.format.manifest import ShardInfo


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> str:
    # stored format 1: a cold shard is fetched whole at once (no frames first, so no request waits for a gather)
    return pack_test_dataset(str(tmp_path_factory.mktemp("prefetcher") / "ds"), 300, shard_size=4096, stored_format=1)


def test_a_prefetch_dropped_by_settle_is_asked_for_again(
    local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settling drops the queued fetches; the shards they were for are asked for again by the next prefetch
    (before, they stayed recorded as asked for, and each was left to the synchronous read of its batch)."""
    asked: list[str] = []
    opened = threading.Event()

    def fetch(_cache: ShardCache, info: ShardInfo) -> None:  # blocks until opened: the later ones queue meanwhile
        asked.append(info.path)
        opened.wait(10)

    monkeypatch.setattr(ShardCache, "ensure_in_background", fetch)
    ds = TokenDataset(local, seq_len=32, seed=2, cache_dir=str(tmp_path / "c"), prefetch=1)
    everything = np.arange(ds.num_samples)
    wanted = len(ds.shards_of(everything, to_fetch=True))
    assert wanted > 3
    ds.prefetch(everything)  # every shard: two running (the prefetch threads, blocked), the rest queued
    deadline = time.monotonic() + 10
    while len(asked) < 2 and time.monotonic() < deadline:  # both threads took a job: settling cannot drop theirs
        time.sleep(0.01)
    pool = ds.reader.prefetcher._ahead  # type: ignore[union-attr]
    settler = threading.Thread(target=ds.settle)
    settler.start()  # drops the queued ones, waits for the running ones
    while not pool._closed and time.monotonic() < deadline:  # type: ignore[union-attr]  # dropped: nothing to take
        time.sleep(0.01)
    opened.set()
    settler.join(10)
    assert len(asked) == 2
    ds.prefetch(everything)
    deadline = time.monotonic() + 10
    while len(asked) < wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    ds.settle()
    assert len(asked) == wanted and sorted(set(asked)) == sorted(asked), (wanted, asked)  # each asked for once
    ds.close()


class _Pool:
    """Stands in for a DaemonPool: records what it is given, runs nothing."""

    started: list[tuple[str, bool]] = []

    def __init__(self, _threads: int, name: str) -> None:
        self.urgent = name == "ferry-whole"

    def submit(self, _fn: Any, info: ShardInfo) -> Future[None]:
        _Pool.started.append((info.path, self.urgent))
        return Future()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


def test_requests_wait_for_the_samples_at_hand_and_an_urgent_one_is_not_queued_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefetcher, "DaemonPool", _Pool)
    started = _Pool.started = []
    p = prefetcher.Prefetcher(SimpleNamespace(ensure_in_background=None))  # type: ignore[arg-type]  # never called
    info = {s: ShardInfo(f"shards/{s}", 1, 0, 1, 1, "xxh128:0", "xxh128:0") for s in range(3)}
    p.request(0, info[0])  # now
    p.request(1, info[1], after_gather=True)  # once the samples at hand are read
    p.request(1, info[1], urgent=True, after_gather=True)  # the same shard, urgently: still one request
    p.request(0, info[0])  # asked for already: nothing
    assert started == [("shards/0", False)]
    assert p.asked(1) and not p.started(1)
    p.release()
    assert started == [("shards/0", False), ("shards/1", True)] and p.started(1)
    p.request(0, info[0], urgent=True)  # a plain request started already: the urgent one goes too
    assert started[-1] == ("shards/0", True)
    p.request(2, info[2], after_gather=True)
    p.settle()  # a waiting request is dropped, and forgotten
    assert not p.asked(2) and not p.started(2)
    p.release()
    assert "shards/2" not in [path for path, _ in started]


def test_the_shards_read_now_are_fetched_side_by_side() -> None:
    """Two urgent requests (the two shards of a window, read by frames) run at once: the second one's parts fill
    the connections the first one leaves free (before, it started only after the first one's last part)."""
    gate = threading.Event()
    running: list[str] = []

    def fetch(info: ShardInfo) -> None:
        running.append(info.path)
        gate.wait(10)

    p = prefetcher.Prefetcher(SimpleNamespace(ensure_in_background=fetch))  # type: ignore[arg-type]
    for s in range(2):
        p.request(s, ShardInfo(f"shards/{s}", 1, 0, 1, 1, "xxh128:0", "xxh128:0"), urgent=True)
    deadline = time.monotonic() + 3  # well before the first one's gate gives up waiting
    while len(running) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    both = sorted(running)
    gate.set()
    p.settle()
    assert both == ["shards/0", "shards/1"]


def test_a_local_gather_starts_as_many_whole_fetches_at_once_as_it_has_spare_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``at_once`` urgent requests of one gather start at once (frames of a local replica are read by the gathering
    thread, so a whole fetch meanwhile uses a core that would idle); the others still wait for the gather's end,
    a plain request waits as before, and each gather counts afresh."""
    monkeypatch.setattr(prefetcher, "DaemonPool", _Pool)
    started = _Pool.started = []
    p = prefetcher.Prefetcher(SimpleNamespace(ensure_in_background=None), at_once=1)  # type: ignore[arg-type]
    info = {s: ShardInfo(f"shards/{s}", 1, 0, 1, 1, "xxh128:0", "xxh128:0") for s in range(5)}
    p.request(0, info[0], after_gather=True)  # the loader's plain prefetch: waits
    assert started == []
    p.request(0, info[0], urgent=True, after_gather=True)  # the reader reads it by frames: now urgent, starts
    p.request(1, info[1], urgent=True, after_gather=True)  # one at once only: waits
    assert started == [("shards/0", True)] and p.started(0) and not p.started(1)
    p.release()
    assert started == [("shards/0", True), ("shards/1", True)]
    p.request(2, info[2], urgent=True, after_gather=True)  # the next gather: one at once again
    p.request(3, info[3], urgent=True, after_gather=True)
    assert started[2:] == [("shards/2", True)]
    p.release()
    assert started[3:] == [("shards/3", True)]
    p.settle()


def test_a_dataset_on_a_local_disk_lets_one_whole_fetch_run_beside_its_cold_gather(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two cores and no worker, the reader's prefetcher of a local dataset may start one whole fetch during a
    gather, and one only with many cores (a container's CPU quota is not in its affinity mask); with as many
    processes as cores (two DataLoader workers), none."""
    ds_path = pack_test_dataset(str(tmp_path / "ds"), 200, shard_size=4096)
    for cores in (2, 64):
        monkeypatch.setattr("os.sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        ds = TokenDataset(ds_path, seq_len=32, seed=2, cache_dir=str(tmp_path / "c"))
        assert ds.reader.prefetcher is not None and ds.reader.prefetcher.at_once == 1
        ds.close()
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    ds = TokenDataset(ds_path, seq_len=32, seed=2, cache_dir=str(tmp_path / "c"))
    assert ds.reader.prefetcher is not None and ds.reader.prefetcher.at_once == 0
    ds.close()


def test_without_an_affinity_mask_the_machines_cores_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the OS has no ``sched_getaffinity`` (macOS), the dataset counts the machine's CPUs instead of failing
    to build its reader."""
    ds_path = pack_test_dataset(str(tmp_path / "ds"), 200, shard_size=4096)
    monkeypatch.delattr("os.sched_getaffinity", raising=False)
    for cores, at_once in ((1, 0), (4, 1)):
        monkeypatch.setattr("os.cpu_count", lambda n=cores: n)
        ds = TokenDataset(ds_path, seq_len=32, seed=2, cache_dir=str(tmp_path / "c"))
        assert ds.reader.prefetcher is not None and ds.reader.prefetcher.at_once == at_once
        ds.close()
