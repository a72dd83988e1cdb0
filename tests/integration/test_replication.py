"""The replication suite, run on file→file, file→memory, file→S3 and S3→file (moto over HTTP)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from faults import faulty_location
from helpers import documents, make_docs, pack

from ferry.service.replication.engine import Engine, PassResult, listing
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.format.manifest import Manifest, ShardTable
from ferry.shard_tools.storage.publish import publish_version
from ferry.shard_tools.storage.store import TEMP_MARKER, Location, resolve

PAIRS = [("file", "file"), ("file", "memory"), ("file", "s3"), ("s3", "file")]


def dead_writers_temp(path: str) -> str:
    """A temp name for ``path`` made by a process on this host that has exited since."""
    code = f"from ferry.shard_tools.storage.store import temp_name; print(temp_name({path!r}))"
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def engine(**kw: Any) -> Engine:
    return Engine(Executor(transfers=4, backoff=(0.001, 0.01), **kw), State(None), keep_versions=kw.pop("keep", None))


def temps(loc: Location) -> list[str]:
    return [p for p in listing(loc) if TEMP_MARKER in p]


@pytest.fixture(params=PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def pair(request: pytest.FixtureRequest) -> tuple[Any, Any]:
    a, b = request.param
    src = request.getfixturevalue(f"{a}_backend")
    dst = request.getfixturevalue(f"{b}_backend")
    return src, dst


def test_full_sync_incremental_and_noop(pair: tuple[Any, Any]) -> None:
    src_b, dst_b = pair
    src_url, dst_url = src_b.url("ds-src"), dst_b.url("ds-dst")
    docs = make_docs(600, 1)
    first = pack(src_url, docs, src_b.storage_options)
    assert first.shards >= 10
    src, dst = resolve(src_url, src_b.storage_options), resolve(dst_url, dst_b.storage_options)
    eng = engine()
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.ok and res.published and res.copied == first.shards and res.copied_bytes == first.stored_bytes
    assert documents(dst_url, dst_b.storage_options) == [d.tolist() for d in docs]
    assert temps(dst) == []
    # a new version appended at the source: only its new shards travel
    more = make_docs(300, 2)
    second = pack(src_url, more, src_b.storage_options, append=True)
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.published and res.version_id == second.version_id
    assert res.copied == second.new_shards and res.already_verified == first.shards
    assert documents(dst_url, dst_b.storage_options) == [d.tolist() for d in docs + more]
    # unchanged: exactly the two manifest reads, nothing else touched
    fsrc, fdst = faulty_location(src), faulty_location(dst)
    res = eng.sync_pass("ds", "a", "b", {"a": fsrc, "b": fdst})
    assert res.up_to_date and res.copied == 0
    assert fsrc.fs.reads == [src.full("manifest.json")] and fdst.fs.reads == [dst.full("manifest.json")]
    assert dict(fsrc.fs.calls) == {"cat_file": 1} and dict(fdst.fs.calls) == {"cat_file": 1}


def test_repairs_wrong_size_cleans_temps_and_resumes_without_state(pair: tuple[Any, Any]) -> None:
    src_b, dst_b = pair
    src_url, dst_url = src_b.url("ds2-src"), dst_b.url("ds2-dst")
    docs = make_docs(400, 3)
    pack(src_url, docs, src_b.storage_options)
    src, dst = resolve(src_url, src_b.storage_options), resolve(dst_url, dst_b.storage_options)
    assert engine().sync_pass("ds", "a", "b", {"a": src, "b": dst}).published
    manifest = open_dataset(dst_url, storage_options=dst_b.storage_options).manifest
    victim = manifest.shards[1]
    dst.write_bytes(victim.path, b"truncated")  # wrong size
    stale = dead_writers_temp(victim.path)  # as left by a writer that was killed
    dst.write_bytes(stale, b"half a shard")
    more = make_docs(100, 4)
    pack(src_url, more, src_b.storage_options, append=True)
    # a fresh engine (empty state: as after losing the database) re-hashes what is there
    res = engine().sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.ok and res.published and res.temps_deleted == 1
    assert res.verified_in_place == len(manifest.shards) - 1  # every intact old shard re-hashed, not copied
    assert temps(dst) == []
    assert documents(dst_url, dst_b.storage_options) == [d.tolist() for d in docs + more]
    dst.write_bytes("manifest.json", b'{"damaged": ')  # a torn manifest at the destination is re-published
    res = engine().sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.published and res.copied == 0
    assert documents(dst_url, dst_b.storage_options) == [d.tolist() for d in docs + more]


def test_scrub_finds_and_repairs_flipped_byte(pair: tuple[Any, Any]) -> None:
    src_b, dst_b = pair
    src_url, dst_url = src_b.url("ds3-src"), dst_b.url("ds3-dst")
    docs = make_docs(300, 5)
    pack(src_url, docs, src_b.storage_options)
    src, dst = resolve(src_url, src_b.storage_options), resolve(dst_url, dst_b.storage_options)
    eng = engine()
    assert eng.sync_pass("ds", "a", "b", {"a": src, "b": dst}).published
    victim = open_dataset(dst_url, storage_options=dst_b.storage_options).manifest.shards[0]
    data = bytearray(dst.read_bytes(victim.path))
    data[len(data) // 2] ^= 0x01  # same size, wrong digest: only a scrub can see it
    dst.write_bytes(victim.path, bytes(data))
    assert eng.sync_pass("ds", "a", "b", {"a": src, "b": dst}).up_to_date
    checked, bad, repaired = eng.scrub("ds", "b", {"a": src, "b": dst})
    assert checked >= 5 and bad == [victim.path] and repaired == [victim.path]
    assert documents(dst_url, dst_b.storage_options) == [d.tolist() for d in docs]


def test_failing_shard_does_not_block_others(file_backend: Any, memory_backend: Any) -> None:
    src_url = file_backend.url("ds4")
    result = pack(src_url, make_docs(300, 6), {})
    src, dst = resolve(src_url), resolve(memory_backend.url("ds4"))
    victim = open_dataset(src_url).manifest.shards[2]
    import os

    os.remove(src.full(victim.path))  # the only copy is gone: a fatal error for that shard alone
    eng = engine()
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert not res.ok and not res.published
    assert [r.job.shard.path for r in res.failed] == [victim.path] and not res.failed[0].retryable
    assert res.copied == result.shards - 1
    assert not dst.exists("manifest.json")  # never a partial version
    errors = eng.state.errors()
    assert [(e.shard, e.retryable) for e in errors] == [(victim.path, False)]
    # the next pass skips the fatal shard until retried; after a retry with the shard back, it completes
    assert eng.sync_pass("ds", "a", "b", {"a": src, "b": dst}).skipped_failed == 1
    src.write_bytes(victim.path, _restore(victim))
    assert eng.state.reset_failed() == 1
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.published and res.copied == 1


def _restore(victim: Any) -> bytes:
    """Rebuild a deleted shard by re-packing the same documents elsewhere (content-addressed)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pack(f"{tmp}/again", make_docs(300, 6), {})
        return resolve(f"{tmp}/again").read_bytes(victim.path)


def test_pulls_from_replica_when_source_fails(file_backend: Any) -> None:
    src_url = file_backend.url("ds5-src")
    pack(src_url, make_docs(200, 7), {})
    src = resolve(src_url)
    near, far = resolve(file_backend.url("ds5-near")), resolve(file_backend.url("ds5-far"))
    eng = Engine(Executor(transfers=2, backoff=(0.001, 0.01)), State(None), priority={"near": 1, "src": 50})
    assert eng.sync_pass("ds", "src", "near", {"src": src, "near": near}).published
    res = eng.sync_pass("ds", "src", "far", {"src": faulty_location(src, flip=1.0), "near": near, "far": far})
    assert res.published and res.corrupt_detected == 0  # near is tried first: the flipping source is not needed
    assert {h.source for h in eng.state.history(limit=1000) if h.destination == "far"} == {"near"}


def test_bandwidth_limit_is_respected(file_backend: Any) -> None:
    src_url = file_backend.url("ds6")
    result = pack(src_url, make_docs(1500, 8), {}, shard_size=64 * 1024)
    src, dst = resolve(src_url), resolve(file_backend.url("ds6-dst"))
    rate = result.stored_bytes / 1.5  # about 1.5 s at the limit
    from ferry.service.transfer.bandwidth import Bandwidth

    eng = Engine(Executor(transfers=4, bandwidth=Bandwidth(rate)), State(None))
    t0 = time.monotonic()
    res: PassResult = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    took = time.monotonic() - t0
    assert res.published
    assert 1.1 < took < 4.0, took


def test_retention_keeps_k_versions_and_last_copies(file_backend: Any) -> None:
    src_url = file_backend.url("ds7")
    docs = make_docs(400, 9)
    pack(src_url, docs, {})
    src = resolve(src_url)
    a, b = resolve(file_backend.url("ds7-a")), resolve(file_backend.url("ds7-b"))
    eng = Engine(Executor(transfers=2), State(None), keep_versions=2)
    locs = {"src": src, "a": a, "b": b}
    assert eng.sync_pass("ds", "src", "a", locs).published
    v1 = open_dataset(src_url).manifest
    # v2 drops the first two shards (a rewrite of history), v3 drops one more
    for drop in (2, 3):
        cur = open_dataset(src_url).manifest
        rows = [s for s in v1.shards][drop:]
        m, table = Manifest.build(name=cur.name, token_dtype=cur.token_dtype, tokenizer=cur.tokenizer,
                                  eos_appended=True, shards=ShardTable.from_rows(rows), parent=cur.version_id,
                                  created_at=f"2099-01-0{drop}T00:00:00+00:00", tool_version="test")  # fmt: skip
        publish_version(src, m, table, expect_current=cur.version_id)
        res = eng.sync_pass("ds", "src", "a", locs)
        assert res.published
    assert len(a.listdir("versions")) == 2
    gone = v1.shards[0].path
    assert res.retired == [v1.version_id]
    # shards 0 and 1 are referenced by no kept version and by no copy elsewhere: protected, not deleted
    assert set(res.protected_shards) == {v1.shards[0].path, v1.shards[1].path} and res.deleted_shards == []
    assert a.exists(gone)
    # once another cluster holds verified copies of them, a later retirement may delete them
    eng.state.add_verified("ds", "b", [v1.shards[0].path, v1.shards[1].path])
    cur = open_dataset(src_url).manifest
    m, table = Manifest.build(name=cur.name, token_dtype=cur.token_dtype, tokenizer=cur.tokenizer, eos_appended=True,
                              shards=ShardTable.from_rows(list(v1.shards)[4:]), parent=cur.version_id,
                              created_at="2099-01-09T00:00:00+00:00", tool_version="test")  # fmt: skip
    publish_version(src, m, table, expect_current=cur.version_id)
    res = eng.sync_pass("ds", "src", "a", locs)
    assert res.published and len(a.listdir("versions")) == 2
    assert v1.shards[0].path in res.deleted_shards and not a.exists(v1.shards[0].path)
    assert v1.shards[2].path in res.protected_shards  # v2's own dropped shard: no copy elsewhere
    assert all(a.exists(s.path) for s in open_dataset(a.url).manifest.shards)


def synthetic_dataset(url: str, sizes: list[int], seed: int = 0) -> Manifest:
    """A dataset whose shard bodies are random bytes (valid manifest; for transfer tests only)."""
    from ferry.shard_tools.format.digest import digest_bytes
    from ferry.shard_tools.format.manifest import ShardInfo, Tokenizer

    loc = resolve(url)
    rng = np.random.default_rng(seed)
    rows = []
    for size in sizes:
        data = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        d = digest_bytes(data)
        path = f"shards/{d.split(':')[1]}.arrow.zst"
        loc.write_bytes(path, data)
        rows.append(ShardInfo(path, 1, size // 2, size, size, d, d))
    m, table = Manifest.build(name="synthetic", token_dtype="uint16", tokenizer=Tokenizer("t", 65536, 0),
                              eos_appended=True, shards=ShardTable.from_rows(rows), parent=None,
                              created_at="2026-01-01T00:00:00+00:00", tool_version="test")  # fmt: skip
    publish_version(loc, m, table, expect_current=None)
    return m


def test_s3_multipart_upload_completes_only_when_verified(file_backend: Any, s3_backend: Any) -> None:
    from ferry.service.transfer.transfer import copy_shard
    from ferry.shard_tools.errors import ShardDigestError

    m = synthetic_dataset(file_backend.url("big"), [12 * 2**20 + 7, 3 * 2**20])
    src, dst = resolve(file_backend.url("big")), resolve(s3_backend.url("big"), s3_backend.storage_options)
    big = m.shards[0]
    with pytest.raises(ShardDigestError):  # one flipped byte: the multipart upload is aborted, nothing appears
        copy_shard(faulty_location(src, flip=1.0, seed=1), dst, big.path, big.stored_bytes, big.stored_digest,
                   chunk_size=5 * 2**20)  # fmt: skip
    dst.fs.invalidate_cache()
    assert not dst.exists(big.path)
    bucket = s3_backend.base.split("://")[1]
    assert dst.fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", []) == []
    # an upload left unfinished by a killed writer is aborted by the next pass
    dst.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=f"big/{big.path}")
    res = engine().sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.published and res.copied == 2 and res.temps_deleted == 1
    assert dst.fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", []) == []
    from ferry.shard_tools.format.digest import digest_bytes

    assert digest_bytes(dst.read_bytes(big.path)) == big.stored_digest
