"""The node-local shard cache and remote replicas: real S3 (moto over HTTP), real files, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import s3fs
from conftest import Backend, free_port
from helpers import wait_until
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.fetching.cache import ShardCache
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.errors import DatasetError, DatasetNotFoundError, ShardError

HERE = Path(__file__).resolve().parents[1]
N_DOCS = 1000  # ~20 shards of 4 KiB


def epoch_rows(ds: TokenDataset, batch: int = 8, workers: int = 0) -> np.ndarray:
    loader = TokenLoader(ds, batch_size=batch, num_workers=workers, rank=0, world_size=1)
    return np.concatenate([b["input_ids"].numpy() for b in loader])


@pytest.fixture(scope="module")
def local_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("local") / "ds"), N_DOCS)


def cached_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("*.arrow"))


def test_s3_with_a_small_cache_gives_the_local_stream(s3_backend: Backend, local_url: str, tmp_path: Path) -> None:
    url = s3_backend.url("corpus")
    s3 = s3fs.S3FileSystem(**s3_backend.storage_options, skip_instance_cache=True)
    for path in Path(local_url).rglob("*"):  # a byte-for-byte replica, as ferry sync would make
        if path.is_file():
            s3.pipe_file(f"{url[5:]}/{path.relative_to(local_url).as_posix()}", path.read_bytes())
    manifest = open_dataset(local_url).manifest
    shards = len(manifest.shards)
    assert shards >= 20
    limit = 3 * int(manifest.shards.raw_bytes.max())
    cache = tmp_path / "cache"
    remote = TokenDataset(
        url,
        seq_len=32,
        seed=5,
        shuffle="window",
        window=2,
        cache_dir=str(cache),
        cache_limit=limit,
        storage_options=s3_backend.storage_options,
    )
    local = TokenDataset(local_url, seq_len=32, seed=5, shuffle="window", window=2, cache_dir=str(tmp_path / "c2"))
    assert remote.version_id == local.version_id  # same content, same version id
    np.testing.assert_array_equal(epoch_rows(remote, workers=2), epoch_rows(local))  # workers fetch over S3 too
    used = sum(p.stat().st_size for p in cached_files(cache))
    # a soft bound: each of the 2 workers keeps its window's 2 shards and a successor (samples that cross a
    # shard's end) in use, and those are never evicted
    in_use = 2 * (2 + 1) * int(manifest.shards.raw_bytes.max())
    assert used <= max(limit, in_use) + int(manifest.shards.raw_bytes.max())
    assert len(cached_files(cache)) < shards // 2  # evicted as it went


def test_a_corrupted_or_half_written_cache_file_is_fetched_again(local_url: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = TokenDataset(local_url, seq_len=32, seed=2, cache_dir=str(cache))
    expected = epoch_rows(first)
    files = cached_files(cache)
    assert len(files) == len(first.manifest.shards) and first.cache.fetches == len(files)
    # flip one byte in the middle of one file (same size), truncate another (as a crash mid-write would)
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    files[0].write_bytes(bytes(data))
    files[1].write_bytes(files[1].read_bytes()[:100])
    again = TokenDataset(local_url, seq_len=32, seed=2, cache_dir=str(cache))
    np.testing.assert_array_equal(epoch_rows(again), expected)
    assert again.cache.fetches == 2
    assert files[0].read_bytes() != bytes(data)


def test_an_unreachable_first_replica_falls_back_to_the_second(local_url: str, tmp_path: Path) -> None:
    dead_http = f"http://127.0.0.1:{free_port()}/ds"  # nothing listens there
    ds = TokenDataset([dead_http, local_url], seq_len=32, seed=1, cache_dir=str(tmp_path / "c"))
    reference = TokenDataset(local_url, seq_len=32, seed=1, cache_dir=str(tmp_path / "c2"))
    np.testing.assert_array_equal(epoch_rows(ds), epoch_rows(reference))


def test_a_bogus_s3_bucket_falls_back(s3_backend: Backend, local_url: str, tmp_path: Path) -> None:
    bogus = "s3://no-such-bucket-ferry/ds"
    ds = TokenDataset(
        [bogus, local_url], seq_len=32, cache_dir=str(tmp_path / "c"), storage_options=s3_backend.storage_options
    )
    assert len(epoch_rows(ds)) >= ds.num_samples


def test_a_replica_missing_or_corrupting_a_shard_falls_back_per_shard(local_url: str, tmp_path: Path) -> None:
    """The first replica serves the manifest but lost one shard and has another corrupted."""
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", local_url, str(broken)], check=True)
    shard_files = sorted((broken / "shards").iterdir())
    shard_files[0].unlink()
    shard_files[1].write_bytes(b"garbage" + shard_files[1].read_bytes()[7:])
    ds = TokenDataset([str(broken), local_url], seq_len=32, seed=3, cache_dir=str(tmp_path / "c"))
    reference = TokenDataset(local_url, seq_len=32, seed=3, cache_dir=str(tmp_path / "c2"))
    np.testing.assert_array_equal(epoch_rows(ds), epoch_rows(reference))
    with pytest.raises(ShardError, match="no replica has a good copy"):
        Replicas([str(broken)]).fetch(open_dataset(local_url).manifest.shards[_index_of(ds, shard_files[0].name)])


def _index_of(ds: TokenDataset, name: str) -> int:
    return [p.split("/")[-1] for p in ds.manifest.shards.paths].index(name)


def test_processes_sharing_a_cache_download_each_shard_once(local_url: str, tmp_path: Path) -> None:
    cache, start = tmp_path / "shared", tmp_path / "go"
    script = HERE / "scripts" / "loader_cache_reader.py"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), local_url, str(cache), str(start)], stdout=subprocess.PIPE, env=env
        )
        for _ in range(2)
    ]
    start.touch()
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    shards = len(open_dataset(local_url).manifest.shards)
    assert sum(r["fetches"] for r in results) == shards  # nobody downloaded a shard twice
    assert len({r["checksum"] for r in results}) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".ferry-tmp")]


def test_jobs_sharing_a_small_cache_never_lose_a_shard_they_read(local_url: str, tmp_path: Path) -> None:
    """Two jobs on one cache_dir whose limit holds a few shards: each evicts what the other fetched, and
    both read exactly the stream of a job alone with a cache that holds everything."""
    cache, start = tmp_path / "shared", tmp_path / "go"
    script = HERE / "scripts" / "loader_cache_reader.py"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    args = [sys.executable, str(script), local_url, str(cache), str(start), str(16 << 10), "2"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, env=env) for _ in range(2)]
    start.touch()
    alone_args = [*args[:3], str(tmp_path / "alone"), str(start), "1GiB", "2"]
    alone = subprocess.run(alone_args, stdout=subprocess.PIPE, env=env, check=True, timeout=300)
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    want = json.loads(alone.stdout)["digest"]
    assert [r["digest"] for r in results] == [want, want]
    shards = len(open_dataset(local_url).manifest.shards)
    assert sum(r["fetches"] for r in results) > shards  # they did evict each other's shards


def test_eviction_never_removes_a_shard_in_use(local_url: str, tmp_path: Path) -> None:
    manifest = open_dataset(local_url).manifest
    replicas = Replicas(local_url)
    user = ShardCache(str(tmp_path / "c"), 10**9, replicas, dtype=manifest.token_dtype)
    leases = [user.open(manifest.shards[i]) for i in range(3)]
    leases[1].release()
    janitor = ShardCache(str(tmp_path / "c"), 0, replicas, dtype=manifest.token_dtype)
    janitor.evict()
    left = {p.name for p in cached_files(tmp_path / "c")}
    assert left == {Path(user.path(manifest.shards[i])).name for i in (0, 2)}
    # the evicted-around shard still maps its own tokens (a janitor that rewrote it would show here)
    np.testing.assert_array_equal(leases[0].view.tokens, open_dataset(local_url).read_shard(0).tokens)
    for lease in leases:
        lease.release()
    janitor.evict()
    assert cached_files(tmp_path / "c") == []


@pytest.mark.parametrize("depth", [0, 3])
def test_prefetch_fetches_the_shards_of_the_next_batches(local_url: str, tmp_path: Path, depth: int) -> None:
    cache = tmp_path / "cache"
    ds = TokenDataset(local_url, seq_len=32, shuffle="none", cache_dir=str(cache), prefetch=depth)
    next(iter(TokenLoader(ds, batch_size=64, rank=0, world_size=1)))
    needed = {Path(ds.cache.path(ds.manifest.shards[s])).name for s in ds.shards_of(np.arange(64 * (1 + depth)))}
    wait_until(lambda: {p.name for p in cached_files(cache)} >= needed, 20, "the background fetches", interval=0.02)
    time.sleep(0.1)  # a fetch beyond the depth would land now; the loader has no public "prefetch idle" to wait on
    assert {p.name for p in cached_files(cache)} == needed  # those, and nothing further ahead
    assert len(needed) >= (4 if depth else 1)


def test_orphaned_temp_files_are_cleaned(local_url: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ds = TokenDataset(local_url, seq_len=32, cache_dir=str(cache))
    orphan, fresh = cache / ".ferry-tmp-0123456789ab-x.arrow", cache / ".ferry-tmp-ba9876543210-y.arrow"
    orphan.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    os.utime(orphan, (0, 0))
    ds.cache.evict()
    assert not orphan.exists() and fresh.exists()


def test_a_download_in_progress_counts_the_blocks_it_reserved(local_url: str, tmp_path: Path) -> None:
    """A shard being fetched has its blocks reserved while its size still grows: the limit counts the blocks."""
    from ferry.shard_tools.libc import reserve_blocks
    from ferry.shard_tools.storage.store import temp_name

    cache = tmp_path / "cache"
    ds = TokenDataset(local_url, seq_len=32, cache_dir=str(cache))
    before = ds.cache.disk_bytes()
    with open(temp_name(str(cache / "x.arrow")), "wb") as f:  # named for this live writer: not stale
        assert reserve_blocks(f.fileno(), 4 << 20)
        f.write(b"begun")
        f.flush()
        assert ds.cache.disk_bytes() - before >= 4 << 20


def test_unreadable_datasets_are_clear_errors(tmp_path: Path, local_url: str) -> None:
    with pytest.raises(DatasetNotFoundError, match="no ferry dataset"):
        TokenDataset(str(tmp_path / "nothing"), seq_len=8, cache_dir=str(tmp_path / "c"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(DatasetError, match="manifest"):
        TokenDataset(str(bad), seq_len=8, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DatasetError, match="not one sample"):
        TokenDataset(local_url, seq_len=10**7, cache_dir=str(tmp_path / "c"))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_dropped_dataset_gives_its_lock_descriptors_back(local_url: str, tmp_path: Path) -> None:
    """Each mapped shard holds its ``use`` lock open; a dataset dropped without closing gives those
    descriptors back (kept until the process ended, a long run creating datasets would run out)."""
    import gc

    gc.collect()
    before = _open_fds()
    for i in range(5):
        ds = TokenDataset(local_url, seq_len=64, cache_dir=str(tmp_path / f"cache{i}"))
        epoch_rows(ds)  # maps every shard
        del ds
    gc.collect()
    assert _open_fds() <= before + 2  # (a little slack for the interpreter's own files)


def disk_bytes(cache: Path) -> int:
    """Every byte of the cache directory's files, as ``du`` counts them (lock files are empty)."""
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def long_sample_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """About 70 shards of 64 KiB (the shape of the report: seq_len 32767 over shards of that size)."""
    return pack_test_dataset(str(tmp_path_factory.mktemp("long") / "ds"), 60000, shard_size=64 << 10)


def test_the_cache_limit_bounds_heads_too(long_sample_url: str, tmp_path: Path) -> None:
    """Each mapped shard keeps its first seq_len + 1 tokens as a head in ``heads/``: here as large as the shard.
    Heads count in the limit and are evicted under it; at no batch does the directory exceed the limit by more
    than the shards mapped right then (which are never evicted)."""
    cache, limit = tmp_path / "cache", 2 << 20
    kw: dict[str, Any] = {"seq_len": 32767, "seed": 3, "shuffle": "window", "prefetch": 0}
    ds = TokenDataset(long_sample_url, cache_dir=str(cache), cache_limit=limit, **kw)
    shards = ds.manifest.shards
    assert len(shards) >= 60 and int(shards.raw_bytes.sum()) > 2 * limit
    peak = 0
    for _ in TokenLoader(ds, batch_size=1, rank=0, world_size=1):
        over = disk_bytes(cache) - ds.reader.mapped_bytes
        peak = max(peak, over)
    assert peak <= limit, (peak, limit)
    assert ds.cache.fetches >= len(shards) // 2  # shards went through the cache whole (not read by frames)
    ds.close()
    ds.cache.evict()
    assert disk_bytes(cache) <= limit


def test_heads_keep_to_their_share_of_the_limit(local_url: str, tmp_path: Path) -> None:
    """Small heads of many shards: together at most an eighth of the limit, the oldest evicted first, and the
    stream is the same as read without any head."""
    cache, limit = tmp_path / "cache", 22 << 10
    kw: dict[str, Any] = {"seq_len": 200, "seed": 3, "shuffle": "window", "window": 1}
    ds = TokenDataset(local_url, cache_dir=str(cache), cache_limit=limit, **kw)
    shards = len(ds.manifest.shards)
    rows = np.concatenate([epoch_rows(ds), epoch_rows(ds)])
    heads = list((cache / "heads").glob("*.head"))
    assert 0 < len(heads) < shards  # some kept, not all: 2.75 KiB of heads is room for 6 of 418 bytes
    assert sum(p.stat().st_size for p in heads) <= limit // 8
    assert all(p.stat().st_size == 201 * 2 + 16 for p in heads)
    ref = TokenDataset(local_url, cache_dir=str(tmp_path / "ref"), **kw)
    ref.reader.head_tokens = 0
    np.testing.assert_array_equal(rows, np.concatenate([epoch_rows(ref), epoch_rows(ref)]))
    ds.close()
    ref.close()
