"""Replication never replaces a stored shard object with other bytes: a destination whose versions
name an object at a shard's name keeps it (the pass fails for that shard, fatally, saying why); only a
damaged copy of exactly what the destination's current version names is repaired."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import make_docs

from ferry.service.replication.engine import Engine
from ferry.service.replication.state import State
from ferry.service.transfer.bandwidth import Bandwidth
from ferry.service.transfer.executor import Executor
from ferry.shard_tools import PackOptions, open_dataset, pack_documents, verify
from ferry.shard_tools.errors import RollbackError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve
from tests.helpers import EOS, VOCAB


def _pack(url: str, docs: Any, opts: dict[str, Any], **kw: Any) -> str:
    o = PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=8192, progress=False, name="ds",
                    storage_options=opts, **kw)  # fmt: skip
    return pack_documents(docs, url, o).version_id


def _engine(**kw: Any) -> Engine:
    return Engine(Executor(transfers=2, retries=2, backoff=(0.001, 0.01)), State(None), **kw)


@pytest.mark.parametrize("dst_kind", ["file", "s3"])
def test_a_forced_sync_does_not_rewrite_the_destinations_shards(
    file_backend: Any, request: pytest.FixtureRequest, dst_kind: str
) -> None:
    dst_b = request.getfixturevalue(f"{dst_kind}_backend")
    src_url, dst_url = file_backend.url("src"), dst_b.url("dst")
    docs = make_docs(80, seed=4)
    _pack(src_url, docs, {}, compression_level=1)
    mine = _pack(dst_url, docs, dst_b.storage_options, compression_level=9)  # same raw shards, other bytes
    dst = resolve(dst_url, dst_b.storage_options)
    before = {n: digest_bytes(dst.read_bytes(f"shards/{n}")) for n in dst.listdir("shards")}
    res = _engine(allow_rollback=True).sync_pass("ds", "a", "b", {"a": resolve(src_url), "b": dst})
    assert not res.published and res.failed
    assert all(not f.retryable and "never replaces" in (f.error or "") for f in res.failed)
    assert {n: digest_bytes(dst.read_bytes(f"shards/{n}")) for n in dst.listdir("shards")} == before
    assert open_dataset(dst_url, storage_options=dst_b.storage_options).version_id == mine
    assert verify(dst_url, storage_options=dst_b.storage_options).ok


def test_an_unnamed_object_at_a_shard_name_is_left_alone(tmp_path: Any) -> None:
    src_url, dst_url = str(tmp_path / "src"), str(tmp_path / "dst")
    _pack(src_url, make_docs(40, seed=6), {})
    src, dst = resolve(src_url), resolve(dst_url)
    path = open_dataset(src_url).manifest.shards.paths[0]
    dst.write_bytes(path, b"a concurrent writer's object")  # e.g. stored by a pack not yet published
    res = _engine().sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert not res.published and [f.job.shard.path for f in res.failed] == [path]
    assert dst.read_bytes(path) == b"a concurrent writer's object"


def test_a_truncated_copy_of_what_the_destination_names_is_repaired(tmp_path: Any) -> None:
    src_url, dst_url = str(tmp_path / "src"), str(tmp_path / "dst")
    _pack(src_url, make_docs(40, seed=7), {})
    src, dst = resolve(src_url), resolve(dst_url)
    eng = _engine()
    assert eng.sync_pass("ds", "a", "b", {"a": src, "b": dst}).published
    path = open_dataset(dst_url).manifest.shards.paths[0]
    full = dst.read_bytes(path)
    (tmp_path / "dst" / path).write_bytes(full[:-10])  # damaged in place
    _pack(src_url, make_docs(10, seed=8), {}, append=True)
    res = _engine().sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.published and res.ok, res.failed
    assert dst.read_bytes(path) == full


class _PackMeanwhile(Bandwidth):
    """Bandwidth that, when the pass first moves bytes, has ``ferry pack`` store the same documents at
    another zstd level straight into the destination (a writer racing the sync; no lease)."""

    def __init__(self, url: str, docs: Any, opts: dict[str, Any]) -> None:
        super().__init__()
        self.url, self.docs, self.opts = url, docs, opts
        self.packed: list[str] = []

    def take(self, link: str | None, n: int, cancel: Any = None, *, node: str | None = None) -> None:
        if not self.packed:
            self.packed.append(_pack(self.url, self.docs, self.opts, compression_level=9))


@pytest.mark.parametrize("dst_kind", ["file", "memory", "s3", "gcs", "azure"])
def test_a_pack_storing_the_shards_meanwhile_keeps_its_objects(
    file_backend: Any, request: pytest.FixtureRequest, dst_kind: str
) -> None:
    """The copy's final step is create-only: the racing pack's objects stay, its version verifies, and the
    pass fails those shards for good (nothing published) instead of naming bytes that differ."""
    dst_b = request.getfixturevalue(f"{dst_kind}_backend")
    src_url, dst_url = file_backend.url("src"), dst_b.url("dst")
    docs = make_docs(80, seed=4)
    _pack(src_url, docs, {}, compression_level=1)
    racer = _PackMeanwhile(dst_url, docs, dst_b.storage_options)
    eng = Engine(Executor(transfers=1, retries=2, backoff=(0.001, 0.01), bandwidth=racer), State(None))
    dst = resolve(dst_url, dst_b.storage_options)
    try:
        res: Any = eng.sync_pass("ds", "a", "b", {"a": resolve(src_url), "b": dst})
    except RollbackError as exc:  # the racer's version stands there: the pass may not replace it
        res = exc
    assert racer.packed and open_dataset(dst_url, storage_options=dst_b.storage_options).version_id == racer.packed[0]
    report = verify(dst_url, storage_options=dst_b.storage_options)
    assert report.ok, ("the racing pack's shard objects were replaced", report.bad)
    assert not isinstance(res, RollbackError) and not res.published and res.failed, res
    assert all(not f.retryable and "never replaces" in (f.error or "") for f in res.failed), res.failed
