"""One round-trip suite on every backend: file://, memory:// and S3 (a moto server over HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ferry.shard_tools import PackOptions, ShardMissingError, open_dataset, pack, pack_documents, verify
from ferry.shard_tools.export import export_megatron
from ferry.shard_tools.format.megatron import read_index
from ferry.shard_tools.storage.store import resolve


def docs_and_files(tmp_path: Path) -> tuple[list[list[int]], list[str]]:
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 30_000, size=int(rng.integers(0, 500))).tolist() for _ in range(240)]
    paths = []
    for i in range(3):
        path = tmp_path / f"in-{i}.parquet"
        pq.write_table(pa.table({"tokens": pa.array(docs[i * 80 : (i + 1) * 80], type=pa.list_(pa.int64()))}), path)
        paths.append(str(path))
    return docs, paths


def opts(backend: Any, **kw: Any) -> PackOptions:
    return PackOptions(
        vocab_size=32_000, eos_id=31_999, shard_size=8192, name="rt", storage_options=backend.storage_options, **kw
    )


def test_roundtrip_append_verify(backend: Any, tmp_path: Path) -> None:
    docs, files = docs_and_files(tmp_path)
    url = backend.url("ds")
    first = pack(files[:2], url, opts(backend, workers=2))
    ds = open_dataset(url, storage_options=backend.storage_options)
    assert ds.version_id == first.version_id and len(ds) == first.shards > 3
    assert [d.tolist() for d in ds.documents()] == docs[:160]
    # the same content packed locally gets the same version id on every backend
    local = pack(
        files[:2], str(tmp_path / "local"), PackOptions(vocab_size=32_000, eos_id=31_999, shard_size=8192, name="rt")
    )
    assert local.version_id == first.version_id

    second = pack(files[2:], url, opts(backend, append=True))
    assert second.parent == first.version_id and second.new_shards >= 1
    ds = open_dataset(url, storage_options=backend.storage_options)
    assert [d.tolist() for d in ds.documents()] == docs
    old = open_dataset(url, storage_options=backend.storage_options, version=first.version_id)
    assert sum(1 for _ in old.documents()) == 160

    report = verify(url, storage_options=backend.storage_options)
    assert report.ok and report.checked == second.shards
    loc = resolve(url, backend.storage_options)
    assert sorted(loc.listdir("versions")) == sorted([f"{first.version_id}.json", f"{second.version_id}.json"])

    prefix = str(tmp_path / "mg")
    assert export_megatron(url, prefix, storage_options=backend.storage_options, keep_eos=False) == len(docs)
    assert int(read_index(prefix).lengths.sum()) == sum(len(d) for d in docs)

    # a missing shard is reported by name on every backend
    victim = ds.manifest.shards[1].path
    loc.remove(victim)
    report = verify(url, storage_options=backend.storage_options)
    assert list(report.bad) == [victim]
    try:
        ds.read_shard(1)
    except ShardMissingError as exc:
        assert exc.shard == victim
    else:
        raise AssertionError("a missing shard was read")


def test_pack_documents_and_read(backend: Any) -> None:
    docs = [[1, 2, 3], [], [7] * 5000]
    url = backend.url("docs")
    pack_documents(docs, url, opts(backend))
    assert [d.tolist() for d in open_dataset(url, storage_options=backend.storage_options).documents()] == docs


def test_cli_pack_to_s3_subprocess(s3_backend: Any, s3_env: dict[str, str], tmp_path: Path) -> None:
    docs, files = docs_and_files(tmp_path)
    url = s3_backend.url("cli")
    env = {**os.environ, **s3_env}
    env.pop("AWS_CA_BUNDLE", None)
    cmd = [sys.executable, "-m", "ferry.shard_tools.cli"]
    proc = subprocess.run(
        [*cmd, "pack", *files, "--out", url, "--vocab-size", "32000", "--eos-id", "31999", "--shard-size", "8KiB",
         "--name", "rt", "--workers", "2", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    ds = open_dataset(url, storage_options=s3_backend.storage_options)
    assert ds.version_id == result["version_id"]
    assert [d.tolist() for d in ds.documents()] == docs
    ver = subprocess.run([*cmd, "verify", url, "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ver.returncode == 0 and json.loads(ver.stdout)["ok"]


def test_inputs_read_from_the_backend_with_a_glob(backend: Any, tmp_path: Path) -> None:
    import fsspec

    docs, files = docs_and_files(tmp_path)
    for f in files:
        with fsspec.open(backend.url(f"in/{Path(f).name}"), "wb", **backend.storage_options) as dst:
            dst.write(Path(f).read_bytes())
    url = backend.url("from-remote")
    res = pack([backend.url("in/in-*.parquet")], url, opts(backend, input_storage_options=backend.storage_options))
    assert res.documents == len(docs)
    assert [d.tolist() for d in open_dataset(url, storage_options=backend.storage_options).documents()] == docs
