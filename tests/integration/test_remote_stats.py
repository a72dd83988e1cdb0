"""loader.stats() against what the proxy saw and a stopwatch around the training loop, with DataLoader
workers (their counters travel with their batches and add up in the main process)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers import upload_to_moto
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from netem import Netem  # noqa: E402

BATCH, SEQ = 8, 32


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> str:
    local = pack_test_dataset(str(tmp_path_factory.mktemp("stats") / "ds"), 1200, shard_size=32 << 10)
    return upload_to_moto(moto_endpoint, local, "replica-stats")


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_add_up(remote: str, moto_endpoint: str, tmp_path: Path, workers: int) -> None:
    with Netem(moto_endpoint, rtt=0.01, conn_rate=20e6, total_rate=0, lifetime=120) as net:
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": net.url}}
        ds = TokenDataset(
            remote,
            seq_len=SEQ,
            shuffle="window",
            window=2,
            cache_dir=str(tmp_path / "c"),
            storage_options=options,
            fetch={"part_size": 4096, "connections": 4},
        )
        loader = TokenLoader(ds, batch_size=BATCH, num_workers=workers, rank=0, world_size=1)
        net.clear()  # the manifest was read before the loader existed: not its traffic
        waited = 0.0
        batches = 0
        t0 = time.perf_counter()
        it = iter(loader)
        for _ in range(len(loader) + 1):
            a = time.perf_counter()
            batch = next(it, None)
            waited += time.perf_counter() - a
            if batch is None:
                break
            batches += 1
            time.sleep(0.002)  # the training step
        wall = time.perf_counter() - t0
        ds.close()
    stats = loader.stats()
    assert stats["batches"] == batches == len(loader)
    assert stats["delivered_bytes"] == batches * BATCH * (SEQ + 1) * 2  # uint16 tokens
    shard_gets = [r for r in net.requests if r.method == "GET" and "/shards/" in r.path]
    rep = stats["replicas"][remote]
    assert rep["requests"] == len(shard_gets) and rep["bytes"] == sum(r.body_bytes for r in shard_gets)
    assert stats["downloaded_bytes"] == rep["bytes"]
    assert stats["downloaded_per_delivered"] == pytest.approx(rep["bytes"] / stats["delivered_bytes"])
    assert stats["shards_fetched"] == len({r.path for r in shard_gets})
    # the loader's clock stops just before it hands a batch over; with workers, its helper thread can take
    # the interpreter between there and this loop's clock (0.1-2 ms on some batches, tens of ms over an
    # epoch measured under load on 2 cores): allowed per batch, far below a stall it failed to count
    per_batch = 0.0005 if workers else 0.0
    assert abs(stats["stall_s"] - waited) < 0.05 + 0.05 * waited + per_batch * batches, (stats["stall_s"], waited)
    assert abs(stats["wall_s"] - wall) < 0.1, (stats["wall_s"], wall)
    assert stats["hedged"] == 0 and stats["failed"] == 0
    assert stats["cache_hits"] + stats["cache_misses"] > 0
    assert rep["latency_p50_s"] is not None and rep["latency_p50_s"] >= 0.01  # at least the added round trip
    text = loader.prometheus()
    line = next(ln for ln in text.splitlines() if ln.startswith(f'ferry_loader_fetch_bytes_total{{replica="{remote}"'))
    assert float(line.rsplit(" ", 1)[1]) == rep["bytes"]
    assert f"ferry_loader_batches_total {batches}" in text
