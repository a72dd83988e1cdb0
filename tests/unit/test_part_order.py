"""The order a process's ranged reads of shards take its connections in: the shard read now before the shards
fetched for later batches, each shard's parts in order, so that the shard needed first ends first."""

from __future__ import annotations

import fcntl
import io
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client.fetching.pools import PriorityPool
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.dataset import open_dataset


def test_a_free_thread_runs_the_best_job_waiting() -> None:
    pool = PriorityPool(1, "test-prio")
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []
    try:
        busy = pool.submit((0,), lambda: (started.set(), gate.wait(10))[1])  # holds the only thread
        assert started.wait(10)  # the others queue behind it
        jobs = [pool.submit(p, ran.append, name) for p, name in [((2, 0), "later-0"), ((2, 1), "later-1")]]
        jobs += [pool.submit((1, 0), ran.append, "now-0"), pool.submit((1, 1), ran.append, "now-1")]
        cancelled = pool.submit((0, 0), ran.append, "cancelled")
        assert cancelled.cancel()
        gate.set()
        assert busy.result(10) is True
        for job in jobs:
            job.result(10)
    finally:
        pool.shutdown(wait=True)
    assert ran == ["now-0", "now-1", "later-0", "later-1"]


def test_shutdown_cancels_the_jobs_still_waiting() -> None:
    pool = PriorityPool(1, "test-prio")
    gate, started = threading.Event(), threading.Event()
    busy = pool.submit((0,), lambda: (started.set(), gate.wait(10))[1])
    assert started.wait(10)  # running: only the job behind it waits for a turn
    waiting = pool.submit((1,), lambda: "ran")
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert busy.result(10) is True
    assert waiting.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit((0,), lambda: None)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("parts") / "ds"), 300, shard_size=1 << 16, stored_format=1)


def test_a_prefetch_yields_its_connections_to_the_shard_read_now(
    local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every part of a shard fetched for later ranks after every part of a shard read now; within a shard,
    parts rank in order (before, all of a process's shard fetches shared the connections first come, first
    served, and the shard needed first ended together with the ones needed later)."""
    ranks: dict[str, list[Any]] = {"now": [], "later": []}
    submit = PriorityPool.submit

    def spy(self: PriorityPool, priority: Any, fn: Any, *args: Any) -> Any:
        ranks["later" if replicas._later.depth else "now"].append(priority)
        return submit(self, priority, fn, *args)

    monkeypatch.setattr(PriorityPool, "submit", spy)
    # two replicas: the only replica of a dataset on a local filesystem is read by the fetching thread itself
    copy = str(tmp_path / "copy")
    shutil.copytree(local, copy)
    replicas = Replicas([local, copy], fetch={"part_size": 4096, "connections": 2})
    replicas._later.depth = 0
    info = open_dataset(local).manifest.shards[0]
    assert info.stored_bytes > 3 * 4096
    with replicas.for_later():
        replicas.fetch_into(info, io.BytesIO())
    out = io.BytesIO()
    replicas.fetch_into(info, out)
    replicas.close()
    assert len(out.getvalue()) == info.raw_bytes
    parts = -(-info.stored_bytes // 4096)
    assert len(ranks["now"]) == len(ranks["later"]) == parts
    assert max(ranks["now"]) < min(ranks["later"])  # the later fetch started first, and still yields
    for got in ranks.values():
        assert got == sorted(got) and len({r[:2] for r in got}) == 1  # one shard's parts, in order


def test_for_later_survives_pickling(local: str, tmp_path: Path) -> None:
    import pickle

    replicas = pickle.loads(pickle.dumps(Replicas(local)))
    with replicas.for_later():
        assert replicas._later.depth == 1
    assert replicas._later.depth == 0


def test_a_part_read_before_the_head_frees_its_connection_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the first part of a fill is still on its way, the parts after it that ended hand their connections
    to the next parts (before, the fill asked a part only as it took one in order: a slow head left the other
    connections idle)."""
    gate = threading.Event()
    asked: list[int] = []
    lock = threading.Lock()
    part = Replicas._part

    def slow_head(self: Replicas, info: Any, a: int, b: int, *args: Any) -> Any:
        with lock:
            asked.append(a)
        if a == 0:
            assert gate.wait(30)
        return part(self, info, a, b, *args)

    monkeypatch.setattr(Replicas, "_part", slow_head)
    big = pack_test_dataset(str(tmp_path / "big"), 1500, shard_size=1 << 22, stored_format=1)
    copy = str(tmp_path / "copy")  # two replicas: the fill reads ranged parts on the pool (see above)
    shutil.copytree(big, copy)
    replicas = Replicas([big, copy], fetch={"part_size": 4096, "connections": 2})
    info = open_dataset(big).manifest.shards[0]
    assert info.stored_bytes > 6 * 4096
    out = io.BytesIO()
    fill = threading.Thread(target=replicas.fetch_into, args=(info, out))
    fill.start()
    try:
        for _ in range(200):  # bounded: 10 s
            with lock:
                if len(asked) >= 5:
                    break
            time.sleep(0.05)
        with lock:
            during = sorted(asked)
    finally:
        gate.set()
        fill.join(30)
        replicas.close()
    # the head and the 4 parts it may hold (2 connections x 2) were asked while the head waited
    assert during == [k * 4096 for k in range(5)], during
    assert len(out.getvalue()) == info.raw_bytes


def test_a_prefetch_keeps_one_read_while_another_process_fills_a_shard_read_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process ranks its own fetches; across processes, one whose thread waits for another's fill of a shard
    it reads now keeps its prefetches to one read meanwhile (before, the two split the link, and the shard read
    now ended together with the one wanted later), and they take their connections back when the wait ends."""
    from ferry.client.fetching.cache import ShardCache, flock_file

    data = pack_test_dataset(str(tmp_path / "d"), 3000, shard_size=1 << 17, stored_format=1)
    copy = str(tmp_path / "copy")  # two replicas: the fills read ranged parts on the pool
    shutil.copytree(data, copy)
    replicas = Replicas([data, copy], fetch={"part_size": 4096, "connections": 4}, cache_dir=str(tmp_path / "c"))
    shards = open_dataset(data).manifest.shards
    now, later = shards[0], shards[1]
    assert later.stored_bytes > 20 * 4096
    cache = ShardCache(str(tmp_path / "c"), 1 << 30, replicas, dtype="uint16")
    flying, lock, waiting = [0], threading.Lock(), threading.Event()
    peaks = {"waiting": 0, "after": 0}
    part = Replicas._part

    def slow(self: Replicas, info: Any, a: int, b: int, *args: Any) -> Any:
        if info.path != later.path:
            return part(self, info, a, b, *args)
        with lock:
            flying[0] += 1
            key = "waiting" if waiting.is_set() else "after"
            peaks[key] = max(peaks[key], flying[0])
        try:
            time.sleep(0.03)
            return part(self, info, a, b, *args)
        finally:
            with lock:
                flying[0] -= 1

    monkeypatch.setattr(Replicas, "_part", slow)

    def prefetch() -> None:
        with replicas.for_later():
            cache.ensure(later)

    other = ShardCache(str(tmp_path / "c"), 1 << 30, Replicas(data), dtype="uint16")  # "another process"
    with flock_file(cache._lock(now, "fetch"), fcntl.LOCK_EX):  # its fill of the shard read now runs
        reader = threading.Thread(target=cache.ensure, args=(now,))
        reader.start()
        for _ in range(200):  # bounded: 10 s
            if replicas._now_waits:
                break
            time.sleep(0.05)
        assert replicas._now_waits == 1
        waiting.set()
        fill = threading.Thread(target=prefetch)
        fill.start()
        time.sleep(0.4)  # about a dozen of the prefetch's parts, one at a time
        other._download(now, other.path(now))  # the other process's fill ends
        waiting.clear()
    reader.join(30)
    fill.join(30)
    replicas.close()
    assert not reader.is_alive() and not fill.is_alive()
    assert cache.fetches == 1  # the prefetch: the shard read now was the other process's to fetch
    assert peaks == {"waiting": 1, "after": 4}, peaks
    assert cache.present(now) and cache.present(later)
