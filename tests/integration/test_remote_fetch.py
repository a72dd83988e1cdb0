"""Training from remote replicas through bench/netem.py (a real proxy in front of the real moto server):
hung replicas cost one deadline, corrupt parts are fetched again, partial local replicas are read
locally, and fetching a shard holds a few parts in memory, not the shard."""

from __future__ import annotations

import shutil
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import upload_to_moto
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.fetching.cache import ShardCache
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.errors import ShardMissingError
from ferry.shard_tools.format.seekable import MIN_FRAME_SIZE
from ferry.shard_tools.packer.packing import PackOptions, pack_documents

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from netem import Netem  # noqa: E402

PART = 4096
FAST = {"part_size": PART, "connections": 4, "deadline_floor": 0.5, "deadline_slack": 1.0}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> dict[str, str]:
    local = pack_test_dataset(str(tmp_path_factory.mktemp("remote") / "ds"), 1500, shard_size=32 << 10)
    return {
        "local": local,
        "a": upload_to_moto(moto_endpoint, local, "replica-a"),
        "b": upload_to_moto(moto_endpoint, local, "replica-b"),
    }


@pytest.fixture(scope="module")
def seekable(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> dict[str, str]:
    """The same documents in stored format 2 (frames of the minimum size), so reads go by frames."""
    local = pack_test_dataset(
        str(tmp_path_factory.mktemp("remote2") / "ds"),
        1500,
        shard_size=32 << 10,
        stored_format=2,
        frame_size=MIN_FRAME_SIZE,
    )
    return {k: upload_to_moto(moto_endpoint, local, f"replica-{k}2") for k in ("a", "b")}


@pytest.fixture
def net(moto_endpoint: str) -> Iterator[Netem]:
    with Netem(moto_endpoint, rtt=0.005, conn_rate=0, total_rate=0, lifetime=120) as proxy:
        yield proxy


def _options(net: Netem) -> dict[str, Any]:
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": net.url}}


def _rows(urls: list[str], net: Netem, cache: Path, **kw: Any) -> tuple[np.ndarray, float]:
    """Every batch of one epoch (and the seconds it took, manifest read included)."""
    t0 = time.perf_counter()
    opts: dict[str, Any] = {"fetch": FAST, "storage_options": _options(net), **kw}
    ds = TokenDataset(
        urls,
        seq_len=32,
        seed=7,
        shuffle="window",
        window=2,
        cache_dir=str(cache),
        **opts,
    )
    loader = TokenLoader(ds, batch_size=8, rank=0, world_size=1)
    rows = np.concatenate([b["input_ids"].numpy() for b in loader])
    ds.close()
    return rows, time.perf_counter() - t0


@pytest.mark.parametrize(
    ("stored", "hang"),
    [(1, "/replica-a/"), (1, "/replica-a/ds/shards/"), (2, "/replica-a2/"), (2, "/replica-a2/ds/shards/")],
    ids=["everything", "shards", "frames-everything", "frames"],
)
def test_a_hung_first_replica_costs_one_deadline(
    dataset: dict[str, str], seekable: dict[str, str], net: Netem, tmp_path: Path, stored: int, hang: str
) -> None:
    """Whole shards (format 1) and frames of format 2, which a cold start reads through the same deadlines."""
    data = dataset if stored == 1 else seekable
    healthy, healthy_s = _rows([data["b"]], net, tmp_path / "c0")
    net.hang(hang, count=10**6)
    rows, hung_s = _rows([data["a"], data["b"]], net, tmp_path / "c1")
    np.testing.assert_array_equal(rows, healthy)
    hung = [r for r in net.requests if r.hung]
    assert hung, "the proxy hung no request: the test did not test anything"
    deadline = FAST["deadline_floor"] + FAST["deadline_slack"] * 0.2  # prior round trip + a small request
    # one deadline, with room for one stall of this process on a loaded machine;
    # a deadline per shard would cost 5 or more (5 shards), and a second round of hung requests fails the check below
    assert hung_s - healthy_s < 2 * deadline + 0.6, (hung_s, healthy_s, len(hung))
    # the hung replica was asked once per request in flight at the time, then not again
    first = min(r.started for r in hung)
    assert all(r.started - first < deadline + 0.3 for r in hung), [r.started - first for r in hung]


def test_a_corrupt_part_is_fetched_again(dataset: dict[str, str], net: Netem, tmp_path: Path) -> None:
    healthy, _ = _rows([dataset["b"]], net, tmp_path / "c0")
    net.clear()
    net.corrupt(lambda r: r.method == "GET" and "/replica-b/ds/shards/" in r.path, count=1)
    rows, _ = _rows([dataset["b"]], net, tmp_path / "c1", prefetch=0)
    np.testing.assert_array_equal(rows, healthy)
    bad = next(r for r in net.requests if r.corrupted)
    again = [r for r in net.requests if r.path == bad.path and r.range == bad.range and not r.corrupted]
    assert again and again[0].started > bad.started and again[0].status == 206


def test_a_partial_local_replica_is_read_locally(dataset: dict[str, str], net: Netem, tmp_path: Path) -> None:
    """The daemon's destination while it fills: some shards, no manifest yet, one shard corrupt."""
    partial = tmp_path / "partial"
    shards = sorted(p.name for p in (Path(dataset["local"]) / "shards").iterdir())
    held, corrupt = shards[::2], shards[0]
    (partial / "shards").mkdir(parents=True)
    for name in held:
        shutil.copy(Path(dataset["local"]) / "shards" / name, partial / "shards" / name)
    data = bytearray((partial / "shards" / corrupt).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (partial / "shards" / corrupt).write_bytes(bytes(data))
    reference, _ = _rows([dataset["local"]], net, tmp_path / "c0")
    storage = [{}, _options(net)]
    slow_ok = {**FAST, "deadline_floor": 5.0}  # not a deadline test: a loaded machine must not hedge to remote
    rows, _ = _rows([str(partial), dataset["b"]], net, tmp_path / "c1", storage_options=storage, fetch=slow_ok)
    np.testing.assert_array_equal(rows, reference)
    remote = {r.path.rsplit("/", 1)[-1] for r in net.requests if r.method == "GET" and "/shards/" in r.path}
    assert remote == (set(shards) - set(held)) | {corrupt}


def test_fetching_a_shard_holds_a_few_parts_not_the_shard(moto_endpoint: str, net: Netem, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 60000, size=50_000).astype(np.int64) for _ in range(60)]  # one ~6 MiB shard
    local = str(tmp_path / "big")
    pack_documents(docs, local, PackOptions(vocab_size=60000, eos_id=0, shard_size=64 << 20, progress=False))
    url = upload_to_moto(moto_endpoint, local, "replica-big")
    info = open_dataset(local).manifest.shards[0]
    part = 64 << 10
    assert info.stored_bytes >= 10 * part and info.raw_bytes >= 4 << 20
    replicas = Replicas(url, _options(net), fetch={"part_size": part, "connections": 4})
    replicas.load_manifest()
    cache = ShardCache(str(tmp_path / "c"), 1 << 30, replicas, dtype="uint16")
    tracemalloc.start()
    try:
        cache.ensure(info)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        replicas.close()
    assert cache.fetches == 1
    assert peak < 3 << 20 and peak < info.raw_bytes / 2, (peak, info.stored_bytes, info.raw_bytes)
    assert len([r for r in net.requests if "/shards/" in r.path]) >= 10


def test_a_replica_that_never_answers_fails_in_bounded_time_with_a_ferry_error_from_workers(
    dataset: dict[str, str], net: Netem, tmp_path: Path
) -> None:
    net.hang("/replica-b/ds/shards/", count=10**6)
    ds = TokenDataset(
        dataset["b"],
        seq_len=32,
        cache_dir=str(tmp_path / "c"),
        storage_options=_options(net),
        fetch={**FAST, "deadline_floor": 0.3},
    )
    t0 = time.perf_counter()
    with pytest.raises(ShardMissingError, match="deadline"):
        for _ in TokenLoader(ds, batch_size=8, num_workers=2, rank=0, world_size=1):
            pass
    assert time.perf_counter() - t0 < 20


def test_a_manifest_longer_than_the_first_ranged_read_is_read_whole(
    dataset: dict[str, str], net: Netem, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ferry.client.fetching.replicas

    whole = Replicas(dataset["b"], _options(net)).load_manifest()
    assert net.count("manifest.json") == 1 and net.count("", method="HEAD") == 0  # one ranged GET, no HEAD
    monkeypatch.setattr(ferry.client.fetching.replicas, "_MANIFEST_HINT", 64)
    net.clear()
    short = Replicas(dataset["b"], _options(net)).load_manifest()
    assert short.version_id == whole.version_id and short.shards.paths == whole.shards.paths
    assert net.count("manifest.json") == 2  # the first 64 bytes, then all of it


def test_s3_locations_share_one_warm_botocore_session(dataset: dict[str, str], net: Netem) -> None:
    """A new botocore session parses botocore's service models again (before the first request of every
    dataset, and of every DataLoader worker); ferry's S3 filesystems share one per process, made
    before a fork and so inherited warm by workers. A caller's profile keeps its own session."""
    from ferry.shard_tools.storage.store import resolve

    a = resolve(dataset["a"], _options(net)).fs
    b = resolve(dataset["b"], {**_options(net), "client_kwargs": {"endpoint_url": net.url + "/"}}).fs
    assert a is not b
    assert a.session is not None and a.session is b.session
    assert resolve(dataset["a"], {**_options(net), "profile": "other"}).fs.session is not a.session
    assert a.ls(dataset["a"].removeprefix("s3://"))  # the shared session makes working clients
    assert b.ls(dataset["b"].removeprefix("s3://"))
