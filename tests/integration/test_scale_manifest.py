"""Manifest cost at scale: a 100k-shard synthetic manifest loads fast and locates samples exactly.

Runs ``bench/scale_manifest.py`` (the same code the benchmark uses) in a child process so
the timing and RSS are not polluted by the rest of the test session. The bounds are loose
(a shared 2-core machine); the manifest design targets well under a second at 100k.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.errors import ManifestError
from ferry.shard_tools.storage.store import resolve

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "scale_manifest.py"


def _bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scale_manifest", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_100k_shard_manifest_loads_fast() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "100000", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (result,) = json.loads(proc.stdout)["results"]
    assert "error" not in result, result
    assert result["shards"] == 100_000
    assert result["load_manifest_s"] < 3.0, result
    assert result["locate_100k_samples_s"] < 1.0, result
    # Columnar table: ~72 bytes a shard (two random digests dominate), header stays tiny.
    assert result["shard_table_bytes"] < 100 * 100_000
    assert result["manifest_json_bytes"] < 4096


def test_synthetic_manifest_round_trips_and_locates(tmp_path: Path) -> None:
    bench = _bench_module()
    info = bench.publish_synthetic(str(tmp_path), 2_000, seed=3)
    manifest = load_manifest(resolve(str(tmp_path)))
    assert manifest.version_id == info["version_id"]
    assert len(manifest.shards) == 2_000
    offsets = manifest.shards.token_offsets
    assert offsets[-1] == info["total_tokens"]
    # Every shard's first and last token are located in that shard.
    import numpy as np

    firsts = offsets[:-1]
    lasts = offsets[1:] - 1
    idx = np.arange(2_000)
    assert np.array_equal(np.searchsorted(offsets, firsts, side="right") - 1, idx)
    assert np.array_equal(np.searchsorted(offsets, lasts, side="right") - 1, idx)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("path", "shards/../escape.arrow.zst"),
        ("path", "elsewhere/x.arrow.zst"),
        ("path", "shards\\x.arrow.zst"),
        ("stored_digest", "xxh128:" + "G" * 32),
        ("raw_digest", "blake3:" + "a" * 32),
        ("raw_digest", None),
    ],
)
def test_one_bad_row_in_a_large_table_is_caught(column: str, value: str | None) -> None:
    """The vectorised validation still names a single bad row among 20k good ones."""
    from ferry.shard_tools.format.manifest import ShardTable

    table = _bench_module().synthetic_table(20_000, seed=5)
    values = table.column(column).to_pylist()
    values[12_345] = value
    bad = table.set_column(table.schema.get_field_index(column), column, pa.array(values, type=pa.string()))
    with pytest.raises(ManifestError) as err:
        ShardTable(bad).validate()
    assert repr(str(value))[1:-1][:20] in str(err.value)
    if value is None:
        assert "row 12345" in str(err.value)
