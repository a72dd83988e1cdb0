"""A stored shard object is never rewritten: ``pack --append`` of the same documents in other stored
bytes (zstd level, frame size, stored format) reuses the object already there, and every version
still verifies — on file://, memory:// and S3 (moto over HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ferry.shard_tools import PackOptions, open_dataset, pack_documents, verify
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.packer import packunit
from ferry.shard_tools.packer.packunit import Job, store_shard
from ferry.shard_tools.sources import DocBatch, SourceOptions
from ferry.shard_tools.storage.store import Location, resolve
from tests.helpers import EOS, VOCAB, make_docs

VARIANTS = {
    "zstd-level": ({"compression_level": 1}, {"compression_level": 7}),
    "frame-size": ({}, {"frame_size": 4096}),
    "format-1-level": ({"stored_format": 1}, {"stored_format": 1, "compression_level": 9}),
}


def options(backend: Any, **kw: Any) -> PackOptions:
    return PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=8192, storage_options=backend.storage_options,
                       progress=False, **kw)  # fmt: skip


def stored_objects(loc: Location) -> dict[str, str]:
    """Digest of every object under shards/ (what a published version may name)."""
    return {name: digest_bytes(loc.read_bytes(f"shards/{name}")) for name in loc.listdir("shards")}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_append_in_other_stored_bytes_keeps_every_version_valid(backend: Any, variant: str) -> None:
    first_kw, second_kw = VARIANTS[variant]
    url = backend.url(f"imm-{variant}")
    docs = make_docs(120, seed=3)
    first = pack_documents(docs, url, options(backend, **first_kw))
    loc = resolve(url, backend.storage_options)
    before = stored_objects(loc)
    second = pack_documents(docs, url, options(backend, append=True, **second_kw))
    assert second.parent == first.version_id and second.new_shards == first.shards
    after = stored_objects(loc)
    assert {k: after[k] for k in before} == before, "a published shard object was rewritten"
    for version, shards in ((first.version_id, first.shards), (second.version_id, second.shards)):
        report = verify(url, storage_options=backend.storage_options, version=version)
        assert report.ok, (version, report.bad, report.error)
        assert report.checked == shards
    ds = open_dataset(url, storage_options=backend.storage_options)
    assert [d.tolist() for d in ds.documents()] == [d.tolist() for d in docs] * 2


def test_a_listing_cached_before_an_append_does_not_hide_its_new_shards(backend: Any) -> None:
    """A process that listed shards/ (fsspec keeps listings of object stores) then appends new shards, stored
    through another handle of the store (a pack unit resolves its own): publishing asks the store whether they
    are there, not the listing it kept."""
    url = backend.url("imm-listed")
    pack_documents(make_docs(60, seed=1), url, options(backend))
    before = stored_objects(resolve(url, backend.storage_options))  # listed: the listing is kept
    second = pack_documents(make_docs(60, seed=2), url, options(backend, append=True))
    assert second.new_shards > 0 and len(stored_objects(resolve(url, backend.storage_options))) > len(before)
    assert verify(url, storage_options=backend.storage_options).ok


def test_workers_pool_append_reuses_objects(file_backend: Any) -> None:
    url = file_backend.url("imm-workers")
    docs = make_docs(160, seed=5)
    first = pack_documents(docs, url, options(file_backend, workers=2))
    second = pack_documents(docs, url, options(file_backend, workers=2, append=True, compression_level=5))
    for version in (first.version_id, second.version_id):
        assert verify(url, version=version).ok


def test_cli_append_other_level_then_verify_both(tmp_path: Path) -> None:
    """The reported sequence through the CLI: pack, pack --append at another zstd level, verify both."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"document {i} " * (i % 40 + 5) + "\n" for i in range(400)))
    out = tmp_path / "ds"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    ferry = [sys.executable, "-m", "ferry.shard_tools.cli"]
    base = ["pack", str(src), "--out", str(out), "--lines", "--tokenizer", "bytes", "--shard-size", "4KiB"]
    ok = subprocess.run([*ferry, *base], env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    v1 = open_dataset(str(out)).version_id
    again = subprocess.run([*ferry, *base, "--append", "--compression", "zstd:9"], env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
    v2 = open_dataset(str(out)).version_id
    for version in (v1, v2):
        checked = subprocess.run([*ferry, "verify", str(out), "--version", version], env=env, capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
        assert checked.returncode == 0, (version, checked.stdout, checked.stderr)


def _job(url: str, storage_options: dict[str, Any], level: int) -> Job:
    return Job(url, storage_options, SourceOptions(), "uint16", VOCAB, EOS, level, stored_format=2)


def _batch() -> DocBatch:
    import numpy as np

    docs = make_docs(30, seed=9)
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return DocBatch(np.concatenate(docs), offsets, None)


def test_damaged_object_at_the_name_is_left_alone_and_the_shard_goes_elsewhere(backend: Any) -> None:
    url = backend.url("imm-damaged")
    job = _job(url, backend.storage_options, 1)
    loc = resolve(url, backend.storage_options)
    probe = store_shard(_job(backend.url("imm-probe"), backend.storage_options, 1), _batch())
    packunit.create_object(loc, probe.path, b"not a shard")
    info = store_shard(job, _batch())
    assert info.path != probe.path and info.path.endswith(".s2.arrow.zst")
    assert loc.read_bytes(probe.path) == b"not a shard"
    assert digest_bytes(loc.read_bytes(info.path)) == info.stored_digest
    again = store_shard(job, _batch())  # the second name is immutable too: identical bytes are reused
    assert again == info


def test_racing_writers_of_one_name_agree_on_what_is_stored(backend: Any) -> None:
    """Threads storing the same content at different levels at once: every row they get back
    describes the one object that ends up stored."""
    url = backend.url("imm-race")
    loc = resolve(url, backend.storage_options)
    rows: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4, timeout=30)

    def one(level: int) -> None:
        try:
            job = _job(url, backend.storage_options, level)
            batch = _batch()
            barrier.wait()
            rows.append(store_shard(job, batch))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(level,)) for level in (1, 3, 6, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(rows) == 4
    assert len({r.path for r in rows}) == 1
    stored = loc.read_bytes(rows[0].path)
    assert {r.stored_digest for r in rows} == {digest_bytes(stored)}
    assert {r.index_digest for r in rows} == {rows[0].index_digest}


def test_store_immutable_describes_the_object_already_stored(memory_backend: Any) -> None:
    loc = resolve(memory_backend.url("imm-unit"), {})
    job = _job(memory_backend.url("imm-unit"), {}, 1)
    info = store_shard(job, _batch())
    before = loc.read_bytes(info.path)
    # a writer holding other stored bytes for this content gets the row of the object already there
    claimed = replace(info, stored_bytes=5, stored_digest=digest_bytes(b"other"), index_digest="")
    got = packunit.store_immutable(loc, claimed, (b"other",))
    assert got == info
    assert loc.read_bytes(info.path) == before


def test_parts_and_merge_append_at_another_level(tmp_path: Path) -> None:
    """``--part I/N`` + ``--merge`` stores shards through the same create-only path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ferry.shard_tools import pack
    from ferry.shard_tools.packer.packing import merge_parts, pack_part

    docs = make_docs(150, seed=12)
    inputs = []
    for i in range(2):
        path = tmp_path / f"in-{i}.parquet"
        part = [d.astype("int64").tolist() for d in docs[i * 75 : (i + 1) * 75]]
        pq.write_table(pa.table({"tokens": pa.array(part, type=pa.list_(pa.int64()))}), path)
        inputs.append(str(path))
    out = str(tmp_path / "fan")
    base = PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=8192, progress=False, name="fan")
    first = pack(inputs, out, base)
    opts = replace(base, append=True, compression_level=8)
    for i in (1, 0):
        pack_part(inputs, out, i, 2, opts)
    second = merge_parts(out, opts)
    assert second.parent == first.version_id
    for version in (first.version_id, second.version_id):
        report = verify(out, version=version)
        assert report.ok, (version, report.bad)


@pytest.mark.slow
def test_create_only_holds_for_multipart_uploads_on_s3(s3_backend: Any) -> None:
    """A shard above s3fs's single-PUT size goes up in parts: the create-only condition holds there too."""
    loc = resolve(s3_backend.url("imm-mpu"), s3_backend.storage_options)
    size = 101 * 2**20
    assert packunit.create_object(loc, "shards/big", b"a" * size) is True
    assert packunit.create_object(loc, "shards/big", b"b" * size) is False
    assert loc.read_bytes("shards/big")[:4] == b"aaaa"


def test_an_oversized_object_at_the_name_is_not_read(memory_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever stands at a shard's name beyond what its content could take stored is diverted from unread."""
    url = memory_backend.url("imm-big")
    probe = store_shard(_job(memory_backend.url("imm-big-probe"), {}, 1), _batch())
    loc = resolve(url, {})
    packunit.create_object(loc, probe.path, b"\0" * (probe.raw_bytes * 2 + 2**20))
    reads: list[str] = []
    original = Location.read_bytes

    def counting(self: Location, rel: str) -> bytes:
        reads.append(rel)
        return original(self, rel)

    monkeypatch.setattr(Location, "read_bytes", counting)
    info = store_shard(_job(url, {}, 1), _batch())
    assert info.path != probe.path and probe.path not in reads


@pytest.mark.slow
def test_ray_append_at_another_level(tmp_path: Path) -> None:
    """Ray tasks store shards through the same create-only path."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'ferry-data[ray]')")
    from parquet_corpus import parquet_corpus

    from ferry.shard_tools import pack

    inputs = parquet_corpus(tmp_path, files=2, docs=150, seed=5)
    out = str(tmp_path / "ds")
    base = PackOptions(vocab_size=50_257, eos_id=50_256, shard_size=16 * 1024, name="ray", progress=False)
    first = pack(inputs, out, base)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        second = pack(inputs, out, replace(base, executor="ray", append=True, compression_level=6))
    finally:
        ray.shutdown()
    for version in (first.version_id, second.version_id):
        assert verify(out, version=version).ok
