"""Start-up and resume cost do not grow with the dataset: a 100,000-shard manifest opens fast."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.format.manifest import Manifest, ShardTable
from ferry.shard_tools.storage.publish import publish_version
from ferry.shard_tools.storage.store import resolve

SHARDS = 100_000


@pytest.fixture(scope="module")
def huge_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A dataset of 100,000 shards, every row the same real (tiny) shard: the manifest is full size,
    the bytes on disk are not."""
    root = tmp_path_factory.mktemp("huge")
    tiny = open_dataset(pack_test_dataset(str(root / "tiny"), 30, shard_size=1 << 20))
    assert len(tiny.manifest.shards) == 1
    info = tiny.manifest.shards[0]
    table = ShardTable.from_rows([info] * SHARDS)
    m = tiny.manifest
    manifest, table_data = Manifest.build(
        name="huge",
        token_dtype=m.token_dtype,
        tokenizer=m.tokenizer,
        eos_appended=m.eos_appended,
        shards=table,
        parent=None,
        created_at=m.created_at,
        tool_version=m.tool_version,
    )
    url = str(root / "huge")
    (Path(url) / "shards").mkdir(parents=True)
    shutil.copy(Path(tiny.url) / info.path, Path(url) / info.path)
    publish_version(resolve(url), manifest, table_data, expect_current=None)
    return url


def _first_batch(url: str, cache: str, state: dict | None = None) -> tuple[float, TokenLoader]:
    t0 = time.perf_counter()
    ds = TokenDataset(url, seq_len=64, seed=3, shuffle="global", cache_dir=cache)
    loader = TokenLoader(ds, batch_size=16, rank=0, world_size=1)
    if state is not None:
        loader.load_state_dict(state)
    batch = next(iter(loader))
    assert tuple(batch["input_ids"].shape) == (16, 64)
    return time.perf_counter() - t0, loader


def test_a_100k_shard_manifest_gives_a_first_batch_fast(huge_url: str, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    _first_batch(huge_url, cache)  # warm the shard cache and imports; the manifest is read again below
    fresh, loader = _first_batch(huge_url, cache)
    n = loader.dataset.num_samples
    assert n > 1_000_000
    state = {**loader.state_dict(), "epoch": 0, "consumed": int(0.9 * n)}
    resumed, again = _first_batch(huge_url, cache, state)
    assert again.position == int(0.9 * n) + 16
    print(f"100k shards: first batch {fresh:.3f}s, resume at 90% {resumed:.3f}s")
    # loose bounds (a shared 2-core box): the design target is well under a second
    assert fresh < 2.0
    assert resumed < 2 * fresh + 0.2
