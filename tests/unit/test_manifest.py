"""The manifest: version ids, canonical bodies, the columnar shard table at scale."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from ferry.shard_tools import ManifestError
from ferry.shard_tools.format.manifest import Manifest, ShardInfo, ShardTable, Tokenizer

DIGEST = "xxh128:" + "0" * 32


def rows(n: int) -> list[ShardInfo]:
    return [ShardInfo(f"shards/{i:032x}.arrow.zst", 10 + i, 1000 + i, 500, 2000, DIGEST, DIGEST) for i in range(n)]


def build(table: ShardTable, **kw: object) -> tuple[Manifest, bytes]:
    args = dict(
        name="d",
        token_dtype="uint16",
        tokenizer=Tokenizer("bytes", 257, 256),
        eos_appended=True,
        shards=table,
        parent=None,
        created_at="2026-01-01T00:00:00+00:00",
        tool_version="0.1.0",
    )
    args.update(kw)
    return Manifest.build(**args)  # type: ignore[arg-type]


def test_version_id_ignores_time_and_tool_but_not_content() -> None:
    t = ShardTable.from_rows(rows(3))
    a, _ = build(t)
    b, _ = build(t, created_at="2030-05-05T00:00:00+00:00", tool_version="9.9")
    assert a.version_id == b.version_id
    assert build(t, name="other")[0].version_id != a.version_id
    assert build(ShardTable.from_rows(rows(4)))[0].version_id != a.version_id
    assert build(t, eos_appended=False)[0].version_id != a.version_id


def test_json_roundtrip_and_totals() -> None:
    m, table = build(ShardTable.from_rows(rows(5)))
    back = Manifest.from_json(m.to_json(), table)
    assert back.version_id == m.version_id and back.totals == m.totals
    assert back.totals["tokens"] == sum(1000 + i for i in range(5))
    assert back.shards[-1] == rows(5)[-1] and list(back.shards) == rows(5)
    assert back.shards.token_offsets.tolist() == np.concatenate([[0], np.cumsum([1000 + i for i in range(5)])]).tolist()


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d.pop("name"), "lacks 'name'"),
        (lambda d: d.update(format=2), "format 2"),
        (lambda d: d.update(eos_appended="yes"), "wrong type"),
        (lambda d: d["shard_table"].update(path="../etc/passwd"), "not under tables/"),
        (lambda d: d["shard_table"].update(digest="md5:abc"), "malformed digest"),
        (lambda d: d.update(name="renamed"), "does not match its version id"),
    ],
)
def test_header_checks(edit: object, needle: str) -> None:
    m, table = build(ShardTable.from_rows(rows(2)))
    doc = json.loads(m.to_json())
    edit(doc)  # type: ignore[operator]
    with pytest.raises(ManifestError, match=needle):
        Manifest.from_json(json.dumps(doc).encode(), table)


def test_bad_rows_are_refused() -> None:
    bad_path = [ShardInfo("../outside.arrow.zst", 1, 1, 1, 1, DIGEST, DIGEST)]
    m, table = build(ShardTable.from_rows(bad_path))
    with pytest.raises(ManifestError, match="not under shards/"):
        Manifest.from_json(m.to_json(), table)
    neg = [ShardInfo("shards/a.arrow.zst", -1, 1, 1, 1, DIGEST, DIGEST)]
    with pytest.raises(ManifestError, match="negative"):
        ShardTable.from_rows(neg)


def test_table_is_cheap_at_100k_shards() -> None:
    table = ShardTable.from_rows(rows(100_000))
    m, data = build(table)
    started = time.perf_counter()
    back = Manifest.from_json(m.to_json(), data)
    i = int(np.searchsorted(back.shards.token_offsets, 50_000_000, side="right")) - 1  # locate a token
    elapsed = time.perf_counter() - started
    assert back.totals["shards"] == 100_000 and 0 <= i < 100_000
    assert elapsed < 1.0, f"loading and locating in a 100k-shard manifest took {elapsed:.2f}s"
    assert len(data) < 100_000 * 40  # compressed columns, not JSON per shard


_POOL_PROBE = """
import sys
import pyarrow as pa
from ferry.shard_tools.format.manifest import ShardTable
from ferry.shard_tools.format.arrays import SMALL_TABLE_BYTES
data = open(sys.argv[1], "rb").read()
assert len(data) < SMALL_TABLE_BYTES
table = ShardTable.from_ipc(data)
table.validate()
print(pa.default_memory_pool().max_memory())
"""


def test_a_small_shard_table_is_read_and_checked_without_arrows_default_pool(tmp_path) -> None:
    """The default pool's first allocation sets up mimalloc's arena (a huge page zeroed, a visible part of a cold
    first batch); a small table's few kilobytes come from malloc. In a fresh process: the pool is the process's."""
    import subprocess
    import sys

    import pyarrow as pa

    from ferry.shard_tools.format.arrays import SMALL_TABLE_BYTES, pool_for

    path = tmp_path / "table.arrow"
    path.write_bytes(ShardTable.from_rows(rows(300)).to_ipc())
    out = subprocess.run([sys.executable, "-c", _POOL_PROBE, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr
    assert pool_for(SMALL_TABLE_BYTES - 1).backend_name == pa.system_memory_pool().backend_name
    assert pool_for(SMALL_TABLE_BYTES).backend_name == pa.default_memory_pool().backend_name
