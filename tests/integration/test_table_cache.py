"""Shard tables through the node cache: N processes starting together read the table from storage once; a spoilt
or truncated cached table is fetched again; a job's stream is the same with the table read from the cache.

Reads from storage are counted by wrapping ``start_read`` (every ranged or whole read a replica serves goes
through it), in real processes started together against a real local dataset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.fetching import replicas as replicas_module
from ferry.client.fetching.cache import ShardCache
from ferry.client.fetching.replicas import Replicas
from ferry.client.fetching.tables import KEPT_TABLES, cached_table
from ferry.shard_tools.format.digest import digest_bytes

RANKS = 8
# one "rank": waits for the go file, loads the manifest through the node cache, prints what it read from storage;
# each table read is held up so that every rank asks while the first one is still reading it
RANK = """
import json, os, sys, time
from ferry.client.fetching import replicas as r
url, cache, ready, go, delay = sys.argv[1:6]
reads = []
real = r.start_read
def counted(loc, rel, start, end, pool, direct=None):
    if rel.startswith("tables/"):
        time.sleep(float(delay))
    fut = real(loc, rel, start, end, pool, direct)
    fut.add_done_callback(lambda f: reads.append([rel, len(f.result()) if not f.exception() else -1]))
    return fut
r.start_read = counted
open(ready, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.002)
m = r.Replicas(url, cache_dir=cache).load_manifest()
print(json.dumps({"reads": reads, "version": m.version_id, "rows": len(m.shards), "paths": m.shards.paths[:5]}))
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("tables") / "ds"), 300)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the code under test, as this process sees it
    return env


def _ranks(url: str, cache: Path, sync: Path, n: int, delay: float = 0.3) -> list[dict[str, Any]]:
    """Start ``n`` rank processes, release them together once all are ready, and return what each printed."""
    sync.mkdir()
    go = sync / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, url, str(cache), str(sync / f"ready{k}"), str(go), str(delay)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
        )
        for k in range(n)
    ]
    try:
        deadline = time.monotonic() + 60
        while sum((sync / f"ready{k}").exists() for k in range(n)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [err.decode()[-2000:] for _, err in outs]
    return [json.loads(out) for out, _ in outs]


def _table_reads(results: list[dict[str, Any]]) -> list[list[Any]]:
    return [read for r in results for read in r["reads"] if read[0].startswith("tables/")]


def _table_file(cache: Path) -> Path:
    (path,) = (cache / "tables").glob("*.arrow")
    return path


def test_ranks_starting_together_read_the_table_from_storage_once(dataset: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    results = _ranks(dataset, cache, tmp_path / "sync", RANKS)
    reads = _table_reads(results)
    table = _table_file(cache)
    assert len(reads) == 1 and reads[0][1] == table.stat().st_size, reads  # N ranks, one read from storage
    assert len({json.dumps({k: r[k] for k in ("version", "rows", "paths")}) for r in results}) == 1
    # the header is still read by every rank (it names the current version); nothing else is
    assert all(read[0] == "manifest.json" for r in results for read in r["reads"] if read not in reads)
    # a second start of the same job reads no table at all
    again = _ranks(dataset, cache, tmp_path / "sync2", 2, delay=0)
    assert _table_reads(again) == [] and again[0]["version"] == results[0]["version"]


def test_without_a_cache_dir_every_rank_reads_the_table(dataset: str, tmp_path: Path) -> None:
    Replicas(dataset).load_manifest()
    Replicas(dataset).load_manifest()
    assert len([c for c in _COUNTED if c.startswith("tables/")]) == 2
    assert not (tmp_path / "tables").exists()


_COUNTED: list[str] = []  # the relative paths this process's replicas were asked for (see _count_reads)


@pytest.fixture(autouse=True)
def _count_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = replicas_module.start_read
    _COUNTED.clear()

    def counted(loc: Any, rel: str, start: Any, end: Any, pool: Any, direct: Any = None) -> Any:
        _COUNTED.append(rel)
        return real(loc, rel, start, end, pool, direct)

    monkeypatch.setattr(replicas_module, "start_read", counted)
    yield
    _COUNTED.clear()


@pytest.mark.parametrize("spoil", ["flip", "truncate", "empty", "longer"])
def test_a_spoilt_cached_table_is_fetched_again(dataset: str, tmp_path: Path, spoil: str) -> None:
    cache = tmp_path / "cache"
    want = Replicas(dataset).load_manifest()
    Replicas(dataset, cache_dir=str(cache)).load_manifest()
    table = _table_file(cache)
    good = table.read_bytes()
    bad = {
        "flip": good[:100] + bytes([good[100] ^ 1]) + good[101:],
        "truncate": good[: len(good) // 2],
        "empty": b"",
        "longer": good + b"\0",
    }[spoil]
    table.write_bytes(bad)
    _COUNTED.clear()
    got = Replicas(dataset, cache_dir=str(cache)).load_manifest()
    assert [c for c in _COUNTED if c.startswith("tables/")] == [want.table_path]
    assert table.read_bytes() == good  # replaced by the good copy
    assert got.version_id == want.version_id and got.shards.paths == want.shards.paths
    _COUNTED.clear()
    Replicas(dataset, cache_dir=str(cache)).load_manifest()
    assert not [c for c in _COUNTED if c.startswith("tables/")]


def test_an_unusable_cache_dir_reads_the_table_from_storage(dataset: str, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    got = Replicas(dataset, cache_dir=str(blocked)).load_manifest()
    assert got.version_id == Replicas(dataset).load_manifest().version_id


def test_a_filler_killed_mid_read_leaves_the_next_process_to_fill(dataset: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sync = tmp_path / "sync"
    sync.mkdir()
    (sync / "go").touch()
    stuck = subprocess.Popen(
        [sys.executable, "-c", RANK, dataset, str(cache), str(sync / "ready"), str(sync / "go"), "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 30
        while not list((cache / ".locks").glob("*.table")) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # inside its (held up) table read, holding the lock
    finally:
        stuck.send_signal(signal.SIGKILL)
        stuck.communicate(timeout=30)
    results = _ranks(dataset, cache, tmp_path / "sync2", 2, delay=0)
    assert len(_table_reads(results)) == 1
    assert _table_file(cache).read_bytes()


def test_the_stream_is_the_same_with_the_table_from_the_cache(dataset: str, tmp_path: Path) -> None:
    def rows(cache: Path) -> np.ndarray:
        ds = TokenDataset(dataset, seq_len=16, seed=3, cache_dir=str(cache))
        loader = TokenLoader(ds, batch_size=4, num_workers=0, rank=1, world_size=2)
        return np.concatenate([b["input_ids"].numpy() for b in loader])

    fresh = rows(tmp_path / "a")
    assert [c for c in _COUNTED if c.startswith("tables/")]
    _COUNTED.clear()
    cached = rows(tmp_path / "a")
    assert not [c for c in _COUNTED if c.startswith("tables/")]  # the table came from the node cache
    np.testing.assert_array_equal(cached, fresh)
    (table,) = (tmp_path / "a" / "tables").glob("*.arrow")
    table.write_bytes(b"x" * table.stat().st_size)  # spoilt in place, same size
    np.testing.assert_array_equal(rows(tmp_path / "a"), fresh)


def test_the_last_tables_read_stay_and_count_in_the_cache_limit(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fetched: list[int] = []

    def table_of(k: int) -> tuple[dict[str, Any], bytes]:
        data = bytes([k]) * (1000 + k)
        return {"path": f"tables/{k}.arrow", "digest": digest_bytes(data), "bytes": len(data)}, data

    for k in range(KEPT_TABLES + 2):
        meta, data = table_of(k)
        assert cached_table(str(cache), meta, lambda k=k, data=data: fetched.append(k) or data) == data
        os.utime(_newest(cache), (time.time() - 100 + k, time.time() - 100 + k))  # distinct recency
    kept = sorted(p.stat().st_size - 1000 for p in (cache / "tables").glob("*.arrow"))
    assert kept == list(range(2, KEPT_TABLES + 2))
    meta, data = table_of(KEPT_TABLES + 1)
    assert cached_table(str(cache), meta, lambda: fetched.append(-1) or data) == data
    assert -1 not in fetched
    shard_cache = ShardCache(str(cache), 1 << 20, Replicas(str(tmp_path)), dtype="uint16")
    assert shard_cache.disk_bytes() == sum(p.stat().st_size for p in (cache / "tables").glob("*.arrow"))


def _newest(cache: Path) -> Path:
    return max((cache / "tables").glob("*.arrow"), key=lambda p: p.stat().st_mtime_ns)
