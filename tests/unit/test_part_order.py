"""The order a process's ranged reads of shards take its connections in: the shard read now before the shards
fetched for later batches, each shard's parts in order, so that the shard needed first ends first."""

from __future__ import annotations

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
