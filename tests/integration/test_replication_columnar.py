"""A pass plans on the shard table's columns: a new version whose shards are mostly verified at the
destination has only its new shards looked up there (no listing of the dataset), and the executor gets
the copies a batch at a time. File → file and file → S3 (moto over HTTP)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from typing import Any

import pytest
from faults import faulty_location
from helpers import documents, make_docs, pack

from ferry.service.replication import engine as engine_module
from ferry.service.replication.engine import Engine
from ferry.service.replication.state import DB_NAME, State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.storage.store import resolve

DESTINATIONS = ["file", "s3"]


def engine(state: State) -> Engine:
    return Engine(Executor(transfers=4, backoff=(0.001, 0.01)), state)


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_version_adding_few_shards_looks_up_only_those(
    kind: str, file_backend: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst_b = request.getfixturevalue(f"{kind}_backend")
    src_url, dst_url = file_backend.url("few-src"), dst_b.url("few-dst")
    docs = make_docs(600, 11)
    first = pack(src_url, docs)
    src, dst = resolve(src_url), resolve(dst_url, dst_b.storage_options)
    eng = engine(State(None))
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.published and res.copied == first.shards  # nothing verified there yet: one listing
    more = make_docs(60, 12)
    second = pack(src_url, more, append=True)
    assert 0 < second.new_shards * 2 <= second.shards
    # a dataset this small is listed; with these limits its few new shards are looked up one by one instead
    monkeypatch.setattr(engine_module, "HEAD_MIN_SHARDS", 1)
    monkeypatch.setattr(engine_module, "HEAD_SHARE", 2)
    watched = faulty_location(dst)
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": watched})
    assert res.ok and res.published and res.copied == second.new_shards and res.already_verified == first.shards
    assert watched.fs.calls["find"] == 0  # no listing of the destination's dataset
    # one lookup per new shard and per sampled verified one (here: all of them; and the lease's own)
    looked_up = second.new_shards + min(engine_module.HEAD_SAMPLE, first.shards)
    assert looked_up <= watched.fs.calls["size"] <= looked_up + 1
    assert documents(dst_url, dst_b.storage_options) == [d.tolist() for d in docs + more]

    # a verified shard gone from the destination is noticed by the sample: the pass lists and copies it again
    victim = open_dataset(dst_url, storage_options=dst_b.storage_options).manifest.shards[0].path
    dst.remove(victim)
    third = pack(src_url, make_docs(60, 15), append=True)
    watched = faulty_location(dst)
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": watched})
    assert res.ok and res.published and res.copied == third.new_shards + 1 and watched.fs.calls["find"] == 1
    assert dst.exists(victim)


def test_a_pass_hands_the_executor_its_copies_a_batch_at_a_time(
    file_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src_url, dst_url = file_backend.url("batch-src"), file_backend.url("batch-dst")
    docs = make_docs(600, 13)
    made = pack(src_url, docs)
    monkeypatch.setattr(engine_module, "JOB_BATCH", 3)
    eng = engine(State(None))
    sizes: list[int] = []
    run = eng.executor.run
    monkeypatch.setattr(eng.executor, "run", lambda jobs, *a, **kw: sizes.append(len(jobs)) or run(jobs, *a, **kw))
    res = eng.sync_pass("ds", "a", "b", {"a": resolve(src_url), "b": resolve(dst_url)})
    assert res.published and res.copied == made.shards
    assert sum(sizes) == made.shards and max(sizes) == 3 and len(sizes) == -(-made.shards // 3)
    assert documents(dst_url) == [d.tolist() for d in docs]


def _same_bytes(value: Any, data: bytes) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview)) and value is not data and bytes(value) == data


def test_a_pass_holds_no_table_bytes_while_it_copies(file_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard table's bytes are read again to publish: no frame of the pass keeps them while it copies (at
    a million shards they are tens of MiB beside the columns, for as long as the copies take)."""
    src_url, dst_url = file_backend.url("held-src"), file_backend.url("held-dst")
    made = pack(src_url, make_docs(300, 17))
    src = resolve(src_url)
    table = src.read_bytes(open_dataset(src_url).manifest.table_path)
    eng = engine(State(None))
    held: list[str] = []
    run = eng.executor.run

    def watching(jobs: Any, *args: Any, **kwargs: Any) -> Any:
        frame = sys._getframe()
        while frame is not None:
            held.extend(f"{frame.f_code.co_name}:{k}" for k, v in frame.f_locals.items() if _same_bytes(v, table))
            frame = frame.f_back
        return run(jobs, *args, **kwargs)

    monkeypatch.setattr(eng.executor, "run", watching)
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": resolve(dst_url)})
    assert res.published and res.copied == made.shards
    assert held == []


def test_a_pass_imports_no_pandas(file_backend: Any) -> None:
    """pyarrow imports pandas on some conversions: over a second and tens of MiB in a daemon that needs none."""
    src_url, dst_url = file_backend.url("np-src"), file_backend.url("np-dst")
    pack(src_url, make_docs(200, 14))
    code = (
        "import sys\n"
        "from ferry.service.replication.engine import Engine\n"
        "from ferry.service.replication.state import State\n"
        "from ferry.service.transfer.executor import Executor\n"
        "from ferry.shard_tools.storage.store import resolve\n"
        "eng = Engine(Executor(), State(None))\n"
        f"res = eng.sync_pass('ds', 'a', 'b', {{'a': resolve({src_url!r}), 'b': resolve({dst_url!r})}})\n"
        "assert res.published, res\n"
        "print('pandas' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


def test_a_local_destination_is_looked_up_by_stat(file_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    src_url, dst_url = file_backend.url("stat-src"), file_backend.url("stat-dst")
    docs, more = make_docs(600, 16), make_docs(60, 17)
    pack(src_url, docs)
    src, dst = resolve(src_url), resolve(dst_url)
    assert dst.local
    eng = engine(State(None))
    assert eng.sync_pass("ds", "a", "b", {"a": src, "b": dst}).published
    second = pack(src_url, more, append=True)
    monkeypatch.setattr(engine_module, "HEAD_MIN_SHARDS", 1)
    monkeypatch.setattr(engine_module, "HEAD_SHARE", 2)

    def no_listing(loc: Any) -> Any:
        raise AssertionError(f"{loc.url} listed")

    monkeypatch.setattr(engine_module, "listing_with_age", no_listing)
    res = eng.sync_pass("ds", "a", "b", {"a": src, "b": dst})
    assert res.ok and res.published and res.copied == second.new_shards
    assert documents(dst_url) == [d.tolist() for d in docs + more]


def test_a_scrub_records_its_verified_shards_a_batch_at_a_time(
    file_backend: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src_url, dst_url = file_backend.url("scrub-src"), file_backend.url("scrub-dst")
    made = pack(src_url, make_docs(600, 18))
    locations = {"a": resolve(src_url), "b": resolve(dst_url)}
    eng = engine(State(tmp_path / "state"))
    assert eng.sync_pass("ds", "a", "b", locations).published
    monkeypatch.setattr(engine_module, "JOB_BATCH", 10)
    checked, bad, _ = eng.scrub("ds", "b", locations)
    assert checked == made.shards and bad == []
    eng.state.close()
    with sqlite3.connect(tmp_path / "state" / DB_NAME) as db:
        rows = db.execute("SELECT COUNT(*) FROM verified_sets WHERE cluster = 'b'").fetchone()[0]
    assert rows == 1 + -(-made.shards // 10)  # the publish's set, then one per batch of the scrub
    assert State(tmp_path / "state").verified("ds", "b") == set(open_dataset(dst_url).manifest.shards.paths)
