"""Many writers: compare-and-swap publishing, monotone destinations, the writer lease.

Each test plays one way two writers could break a dataset (two appends racing, a sync moving a
destination back, a second writer beside a lease holder) with a deterministic interleaving;
test_adv_concurrent_writers.py runs the same guarantees as a property over random real processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import documents, make_docs, pack, wait_until

from ferry.service.replication.engine import Engine
from ferry.service.replication.lease import LEASE_FILE, Lease, read_lease
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.errors import LeaseHeldError, RollbackError
from ferry.shard_tools.format.header import version_path
from ferry.shard_tools.storage import publish
from ferry.shard_tools.storage.publish import descends_from, lineage_path, store_version, swap_manifest
from ferry.shard_tools.storage.store import Location, resolve, temp_name

ROOT = Path(__file__).resolve().parents[2]


def ferry(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-c", "import sys; from ferry.shard_tools.cli import main; sys.exit(main())", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)


def engine() -> Engine:
    return Engine(Executor(transfers=2, backoff=(0.001, 0.01)), State(None), writer="sync")


@pytest.fixture(params=["file", "memory"])
def local_backend(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_backend")


def test_append_that_loses_the_race_is_rebased(local_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writer A reads the current version; B publishes an append before A writes: A must not
    overwrite B's version (it did, and both reported success), but re-base on it."""
    url, opts = local_backend.url("race"), local_backend.storage_options
    first, a_docs, b_docs = make_docs(50, 1), make_docs(40, 2), make_docs(30, 3)
    pack(url, first, opts)
    real_read = Location.read_bytes
    state = {"armed": True}

    def read_then_let_b_in(self: Location, rel: str) -> bytes:
        data = real_read(self, rel)
        if rel == "manifest.json" and state["armed"] and state.get("a_stored"):
            state["armed"] = False
            pack(url, b_docs, opts, append=True)  # B: a whole append between A's read and A's write
        return data

    real_write_if = publish.write_if

    def note_a_stored(loc: Location, rel: str, data: bytes, token: str | None) -> str:
        got = real_write_if(loc, rel, data, token)
        if rel.startswith("versions/") and state["armed"]:
            state["a_stored"] = True  # A's version is stored: its next manifest read is the check
        return got

    monkeypatch.setattr(Location, "read_bytes", read_then_let_b_in)
    monkeypatch.setattr(publish, "write_if", note_a_stored)
    result_a = pack(url, a_docs, opts, append=True)
    monkeypatch.undo()
    assert not state["armed"], "the interleaving did not happen"
    got = documents(url, opts)
    expected = [d.tolist() for d in first + b_docs + a_docs]
    assert got == expected  # B's documents are kept, A's come after them
    current = load_manifest(resolve(url, opts))
    assert current.version_id == result_a.version_id and current.parent is not None
    parent = load_manifest(resolve(url, opts), current.parent)
    assert parent.shards.paths == current.shards.paths[: -result_a.new_shards]


def _grown(backend: Any) -> tuple[str, str, str]:
    """A source at v2 (child of v1) and a frozen copy of it at v1."""
    src, old = backend.url("grow"), backend.url("grow-v1")
    pack(src, make_docs(60, 4), backend.storage_options)
    res = engine().sync_pass("d", "a", "b", {"a": resolve(src, backend.storage_options),
                                             "b": resolve(old, backend.storage_options)})  # fmt: skip
    assert res.published
    pack(src, make_docs(20, 5), backend.storage_options, append=True)
    return src, old, backend.url("dest")


def test_sync_of_an_older_version_is_refused(cas_backend: Any) -> None:
    """A sync of v1 after a sync of v2 is refused (exit 1): the destination stays at v2 unless
    ``--allow-rollback`` is given."""
    backend = cas_backend
    if backend.name == "memory":
        pytest.skip("memory:// lives in one process; the CLI runs in another")
    src, old, dst = _grown(backend)
    opts = backend.storage_options
    env = backend.env
    assert ferry("sync", src, dst, "--json", env=env).returncode == 0
    v2 = load_manifest(resolve(dst, opts)).version_id
    proc = ferry("sync", old, dst, "--json", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refusing to publish" in proc.stderr and "--allow-rollback" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert load_manifest(resolve(dst, opts)).version_id == v2
    forced = ferry("sync", old, dst, "--json", "--allow-rollback", env=env)
    assert forced.returncode == 0, forced.stderr
    assert load_manifest(resolve(dst, opts)).version_id == load_manifest(resolve(old, opts)).version_id


def test_slow_sync_does_not_overwrite_a_newer_version(cas_backend: Any) -> None:
    """A sync of v1 is still copying when v2 is published at the destination by another writer:
    its publish must be refused, not roll the destination back."""
    backend = cas_backend
    src, old, dst = _grown(backend)
    opts = backend.storage_options
    locs = {n: resolve(u, opts) for n, u in (("src", src), ("old", old), ("dst", dst))}
    newer = load_manifest(locs["src"])
    table = locs["src"].read_bytes(newer.table_path)

    def another_writer_publishes_v2(_: Any) -> None:
        body = store_version(locs["dst"], newer, table)
        for path in newer.shards.paths:
            locs["dst"].write_bytes(path, locs["src"].read_bytes(path))
        assert swap_manifest(locs["dst"], lambda _doc: body) == body

    with pytest.raises(RollbackError, match="refusing to publish"):
        engine().sync_pass("d", "old", "dst", locs, on_plan=another_writer_publishes_v2)
    assert load_manifest(locs["dst"]).version_id == newer.version_id
    ok, _ = descends_from([locs["src"]], newer.version_id, load_manifest(locs["old"]).version_id)
    assert ok


def test_two_writers_of_one_version_leave_its_header_as_the_first_stored_it(cas_backend: Any) -> None:
    """Two packs of the same documents on the same parent make the same version with another ``created_at``:
    ``versions/<id>.json`` (and ``lineage/<id>.json``) keep the first header stored, which every writer then
    publishes (the second used to rewrite it: a published object changed under its readers), also when
    the two race."""
    url, opts = cas_backend.url("same"), cas_backend.storage_options
    pack(url, make_docs(40, 1), opts)
    loc = resolve(url, opts)
    manifest = load_manifest(loc)
    table = loc.read_bytes(manifest.table_path)
    first = loc.read_bytes(version_path(manifest.version_id))
    later = dataclasses.replace(manifest, created_at="2099-01-01T00:00:00Z")
    assert later.to_json() != first
    assert store_version(loc, later, table) == first
    assert loc.read_bytes(version_path(manifest.version_id)) == first
    assert loc.read_bytes(lineage_path(manifest.version_id)) == first
    # the race: a version not stored at loc yet, four writers at once
    pack(cas_backend.url("other"), make_docs(30, 7), opts)
    fresh = load_manifest(resolve(cas_backend.url("other"), opts))
    fresh_table = resolve(cas_backend.url("other"), opts).read_bytes(fresh.table_path)
    bodies = [dataclasses.replace(fresh, created_at=f"2099-01-0{i + 1}T00:00:00Z").to_json() for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda b: store_version(loc, fresh, fresh_table, b), bodies))
    stored = loc.read_bytes(version_path(fresh.version_id))
    assert stored in bodies and got == [stored] * 4


@pytest.fixture
def holder(file_backend: Any) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Another live process (this host) holding the lease of a destination dataset."""
    dst = file_backend.url("held")
    code = (
        "import sys, time; from ferry.service.replication.lease import Lease; "
        "from ferry.shard_tools.storage.store import resolve; "
        f"lease = Lease(resolve({dst!r}), 'daemon'); lease.acquire(); print('held', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield dst, proc
    finally:
        proc.kill()
        proc.wait(10)


def test_second_writer_stays_out_while_the_lease_is_held(
    file_backend: Any, holder: tuple[str, subprocess.Popen[str]]
) -> None:
    dst, proc = holder
    src = file_backend.url("src")
    pack(src, make_docs(40, 6), {})
    held = read_lease(resolve(dst))
    assert held is not None and held.pid == proc.pid and held.kind == "daemon"
    run = ferry("sync", src, dst)
    assert run.returncode == 1 and "is being written by daemon" in run.stderr and str(proc.pid) in run.stderr
    assert not resolve(dst).exists("manifest.json")
    with pytest.raises(LeaseHeldError) as info, Lease(resolve(dst), "sync"):
        pass
    assert info.value.holder == held.holder
    proc.send_signal(signal.SIGKILL)  # the holder dies: its lease ends at once, not after the ttl
    proc.wait(10)
    run = ferry("sync", src, dst, "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["published"]
    assert read_lease(resolve(dst)) is None  # released at the end of the sync


def test_a_live_writers_temp_file_is_not_deleted(file_backend: Any) -> None:
    """A sync deleted every temp file it found, also one a live writer was still filling."""
    src, dst = file_backend.url("src"), file_backend.url("dst")
    pack(src, make_docs(40, 7), {})
    assert ferry("sync", src, dst).returncode == 0
    pack(src, make_docs(10, 8), {}, append=True)
    live = Path(resolve(dst).full(temp_name("shards/being-written.arrow.zst")))  # this live process' name
    live.write_bytes(b"half")
    run = ferry("sync", src, dst, "--json")
    assert run.returncode == 0, run.stderr
    assert live.exists() and live.read_bytes() == b"half"


def test_lease_is_renewed_while_held_and_released(file_backend: Any) -> None:
    loc = resolve(file_backend.url("renew"))
    lease = Lease(loc, "daemon", ttl=0.3)
    with lease:
        first = read_lease(loc)
        assert first is not None and first.holder == lease.holder

        def renewed() -> bool:
            now = read_lease(loc)
            return now is not None and now.expires_at > first.expires_at

        wait_until(renewed, 5, "the lease to be renewed", interval=0.02)
    assert read_lease(loc) is None and loc.exists(LEASE_FILE)
