"""Each byte of a remote shard crosses the link once per node: frames read before the shard is whole are not
fetched again by its fill, a frame whose span a fill is fetching waits for it, a bad byte kept on the node costs
a read from a replica (never a wrong shard), and the node's processes fill different shards at once. A real
moto server behind the bench's proxy, which counts every byte it carries."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import upload_to_moto
from scripts.loader_common import pack_test_dataset

from ferry.client.fetching import arrived as arrived_module
from ferry.client.fetching.arrived import ArrivedBytes
from ferry.client.fetching.cache import ShardCache, flock_file
from ferry.client.fetching.frames import frame_reader_for
from ferry.client.fetching.replicas import Replicas
from ferry.client.media.cached import CachedShards
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.seekable import MIN_FRAME_SIZE, check_frame, load_index

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from netem import Netem  # noqa: E402

FETCH = {"part_size": 1 << 20, "connections": 4, "deadline_floor": 5.0}


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> dict[str, str]:
    local = pack_test_dataset(
        str(tmp_path_factory.mktemp("arrived") / "ds"), 3000, shard_size=256 << 10, frame_size=MIN_FRAME_SIZE
    )
    return {"local": local, "url": upload_to_moto(moto_endpoint, local, "arrived")}


@pytest.fixture
def net(moto_endpoint: str) -> Iterator[Netem]:
    with Netem(moto_endpoint, rtt=0.002, conn_rate=0, total_rate=0, lifetime=120) as proxy:
        yield proxy


def _replicas(remote: dict[str, str], net: Netem, cache: Path, share_fills: bool = True) -> Replicas:
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": net.url}}
    return Replicas(remote["url"], options, fetch=FETCH, cache_dir=str(cache), share_fills=share_fills)


def _shard_bytes(net: Netem, info: ShardInfo) -> int:
    return sum(r.body_bytes for r in net.requests if r.method == "GET" and r.path.endswith(info.path))


def _big_shard(replicas: Replicas) -> ShardInfo:
    shards = replicas.load_manifest().shards
    info = max((shards[i] for i in range(len(shards))), key=lambda s: s.stored_bytes)
    assert info.frame_size and info.stored_bytes > 64 << 10
    return info


def _cache(replicas: Replicas, cache: Path) -> ShardCache:
    return ShardCache(str(cache), 1 << 30, replicas, dtype="uint16")


@pytest.mark.parametrize("share_fills", [True, False])
def test_frames_read_before_the_fill_are_not_fetched_again(
    remote: dict[str, str], net: Netem, tmp_path: Path, share_fills: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrived_module, "_GRACE", 60.0)  # what the fill shared stays for the check below
    replicas = _replicas(remote, net, tmp_path / "cache", share_fills)
    info = _big_shard(replicas)
    frames = frame_reader_for(replicas.load_manifest(), replicas, 64 << 20)
    assert frames is not None
    index = frames.index(info)
    middle = info.raw_bytes // 2
    frames.raw(info, middle, middle + 3 * index.frame_size)  # a few frames of a sample, then the fill
    kept = sum(e - s for s, e in ArrivedBytes(str(tmp_path / "cache")).spans(info))
    assert kept > 3 * MIN_FRAME_SIZE // 4  # the frames, the index and the head
    net.clear()
    _cache(replicas, tmp_path / "cache").ensure(info)
    # the fill fetched the rest only (the proxy counts every byte it carried); the shard in the cache is whole
    # and checked against both manifest digests (ensure raises otherwise)
    assert _shard_bytes(net, info) == info.stored_bytes - kept
    assert (tmp_path / "cache" / (info.raw_digest.split(":")[1] + ".arrow")).stat().st_size == info.raw_bytes
    # a fill shares its own parts only for a loader that reads frames meanwhile (writing them costs it time)
    after = sum(e - s for s, e in ArrivedBytes(str(tmp_path / "cache")).spans(info))
    assert (after == info.stored_bytes) if share_fills else (after == kept)


def _index(remote: dict[str, str], info: ShardInfo) -> tuple[bytes, Any]:
    stored = Path(remote["local"], info.path).read_bytes()
    return stored, load_index(stored[info.stored_bytes - info.index_bytes :], info)


def test_a_bad_byte_kept_on_the_node_costs_a_read_never_a_wrong_shard(
    remote: dict[str, str], net: Netem, tmp_path: Path
) -> None:
    replicas = _replicas(remote, net, tmp_path / "cache")
    info = _big_shard(replicas)
    stored, index = _index(remote, info)
    offset, length = index.span(3)
    arrived = ArrivedBytes(str(tmp_path / "cache"))
    arrived.keep(info, offset, b"\x5a" * length)  # frame 3's span, recorded as arrived, wrong
    net.clear()
    cache = _cache(replicas, tmp_path / "cache")
    cache.ensure(info)  # checked against both manifest digests: raises on a wrong shard
    # the first round spliced the bad bytes and failed its digest; the second read the replica whole
    assert _shard_bytes(net, info) == 2 * info.stored_bytes - length
    assert cache.fetches == 1 and cache.present(info)
    # a frame read refuses bad bytes kept on the node and takes the replica's
    arrived.keep(info, offset, b"\x5a" * length)
    data = replicas.read_range(info, offset, length, check=lambda d: check_frame(index, 3, d, info.path))
    assert data == stored[offset : offset + length]


def test_a_frame_a_live_fill_is_fetching_waits_for_it(remote: dict[str, str], net: Netem, tmp_path: Path) -> None:
    replicas = _replicas(remote, net, tmp_path / "cache")
    info = _big_shard(replicas)
    stored, index = _index(remote, info)
    offset, length = index.span(5)
    arrived = ArrivedBytes(str(tmp_path / "cache"))
    with arrived.filling(info):  # a fill of another process, as far as the reader can tell
        arrived.claim(info, 0, info.stored_bytes)
        later = threading.Timer(0.3, arrived.keep, (info, 0, stored))
        later.start()
        net.clear()
        t0 = time.monotonic()
        data = replicas.read_range(info, offset, length, check=lambda d: check_frame(index, 5, d, info.path))
        waited = time.monotonic() - t0
        later.join()
    assert data == stored[offset : offset + length]
    assert _shard_bytes(net, info) == 0  # not fetched twice
    assert 0.2 < waited < 3.0


def test_processes_fill_different_shards_at_once(remote: dict[str, str], net: Netem, tmp_path: Path) -> None:
    """A shard another process is filling (its fetch lock held) is passed over for the next one asked for, and
    waited for once nothing else is asked."""
    replicas = _replicas(remote, net, tmp_path / "cache")
    shards = replicas.load_manifest().shards
    a, b = shards[0], shards[1]
    cache = _cache(replicas, tmp_path / "cache")
    cached = CachedShards(cache)
    lock = str(tmp_path / "cache" / ".locks" / f"{a.raw_digest.split(':')[1]}.fetch")
    with flock_file(lock, fcntl.LOCK_EX):
        assert cache.ensure_in_background(a, wait=False) is False
        cached.fill(a)
        cached.fill(b)
        deadline = time.monotonic() + 30
        while not cache.present(b) and time.monotonic() < deadline:  # bounded: 30 s
            time.sleep(0.02)
        assert cache.present(b) and not cache.present(a)
    cached.settle()  # a waited for, then filled here
    assert cache.present(a)
    cached.close()


def test_a_local_replica_keeps_nothing_on_the_node(remote: dict[str, str], tmp_path: Path) -> None:
    replicas = Replicas(remote["local"], cache_dir=str(tmp_path / "cache"))
    assert replicas.arrived is None
    with contextlib.suppress(FileNotFoundError):
        assert not any((tmp_path / "cache" / "arrived").iterdir())


def test_frames_fetched_ahead_skip_a_shard_whole_on_the_node(
    remote: dict[str, str], net: Netem, tmp_path: Path
) -> None:
    """A batch's frames planned while their shard was being filled are not fetched once it is whole: the reads
    that follow take it from the cache."""
    replicas = _replicas(remote, net, tmp_path / "cache")
    info = _big_shard(replicas)
    whole = {"now": False}
    frames = frame_reader_for(replicas.load_manifest(), replicas, 64 << 20, lambda _info: whole["now"])
    assert frames is not None
    frames.index(info)
    spans = [(info, 1000, 1200), (info, 30000, 30100)]
    whole["now"] = True
    net.clear()
    frames.prefetch_tokens(spans, np.dtype("u1"))
    assert _shard_bytes(net, info) == 0
    whole["now"] = False
    frames.prefetch_tokens(spans, np.dtype("u1"))
    assert _shard_bytes(net, info) > 0


def test_frames_kept_on_the_node_stay_within_the_cache_limit(
    remote: dict[str, str], net: Netem, tmp_path: Path
) -> None:
    """A loader that only reads frames (a global shuffle of a dataset larger than its cache) never fills a
    shard: the bytes it keeps are evicted within the cache's limit all the same."""
    replicas = _replicas(remote, net, tmp_path / "cache", share_fills=True)
    manifest = replicas.load_manifest()
    limit = 32 << 10
    cache = ShardCache(str(tmp_path / "cache"), limit, replicas, dtype="uint16")
    frames = frame_reader_for(manifest, replicas, 1 << 20)
    assert frames is not None
    info = _big_shard(replicas)
    step = 16 << 10  # the cache's eviction step for this limit
    assert info.stored_bytes > 4 * (limit + step)
    arrived = ArrivedBytes(str(tmp_path / "cache"))
    index = frames.index(info)
    most = 0
    for k in range(len(index.stored_sizes) - 1):  # frame by frame, as samples of a global shuffle read them
        frames.raw(info, k * index.frame_size, min((k + 1) * index.frame_size, info.raw_bytes))
        most = max(most, sum(size for _, size, _ in arrived.held()))
    biggest = int(index.stored_sizes.max())
    assert most <= limit + step + 2 * (biggest + 4096), most  # a step, and a frame's blocks on the disk
    assert cache.disk_bytes() <= limit + step + 2 * (biggest + 4096)


def test_bad_bytes_written_again_after_a_failed_check_are_not_trusted(
    remote: dict[str, str], net: Netem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something on the node that keeps writing wrong bytes (a broken or hostile process sharing the cache
    directory) costs a fill one round, not the shard: once a check failed, the fill reads the replicas only."""
    replicas = _replicas(remote, net, tmp_path / "cache")
    info = _big_shard(replicas)
    _, index = _index(remote, info)
    offset, length = index.span(3)
    arrived = ArrivedBytes(str(tmp_path / "cache"))
    drop = ArrivedBytes.drop

    def drop_and_spoil(self: ArrivedBytes, shard: ShardInfo) -> None:
        drop(self, shard)
        self.keep(shard, offset, b"\x5a" * length)

    monkeypatch.setattr(ArrivedBytes, "drop", drop_and_spoil)
    arrived.keep(info, offset, b"\x5a" * length)
    cache = _cache(replicas, tmp_path / "cache")
    cache.ensure(info)  # raises ShardDigestError when the second round splices the spoilt bytes again
    assert cache.present(info) and cache.fetches == 1
