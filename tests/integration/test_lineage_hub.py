"""Retention at a hub does not strand the replicas that follow it.

A → B by the daemon's engine with ``keep_versions=2``; C follows B with ``ferry sync`` (the README's
``s3://… → /nvme`` pattern). After appends at A, B has pruned ``versions/`` below C's version; C
still syncs forward, because ancestry is read from ``lineage/`` (never pruned). A genuine rollback
is still refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import documents, make_docs, pack

from ferry.service.replication.engine import Engine
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.errors import RollbackError
from ferry.shard_tools.storage.store import resolve

HUBS = ["file", "memory", "s3"]


def ferry_sync(src: str, dst: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys; from ferry.shard_tools.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "sync", src, dst, "--json", "--no-progress", *extra]
    full_env = {**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env)


def hub_engine() -> Engine:
    return Engine(Executor(transfers=2, backoff=(0.001, 0.01)), State(None), keep_versions=2)


def test_hub_retention_does_not_strand_a_follower(tmp_path: Path) -> None:
    a_url, b_url, c_url = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")
    a, b = resolve(a_url), resolve(b_url)
    eng = hub_engine()
    pack(a_url, make_docs(60, 1))
    assert eng.sync_pass("ds", "a", "b", {"a": a, "b": b}).published
    first = ferry_sync(b_url, c_url)
    assert first.returncode == 0, first.stderr
    c_version = open_dataset(c_url).version_id
    for round_ in range(3):  # appends at A; the second round publishes two versions between passes
        pack(a_url, make_docs(20, 10 + round_), append=True)
        if round_ == 1:
            pack(a_url, make_docs(20, 20), append=True)
        res = eng.sync_pass("ds", "a", "b", {"a": a, "b": b})
        assert res.ok and res.published, res
    assert not b.exists(f"versions/{c_version}.json"), "retention at B did not prune C's version"
    assert b.exists(f"lineage/{c_version}.json"), "retention deleted a lineage record"
    forward = ferry_sync(b_url, c_url)
    assert forward.returncode == 0, forward.stderr + forward.stdout
    assert open_dataset(c_url).version_id == open_dataset(a_url).version_id
    assert documents(c_url) == documents(a_url)


def test_hub_follower_two_behind_on_every_hub_backend(request: pytest.FixtureRequest) -> None:
    """The same on a memory:// and an S3 hub, through the engine (C two passes behind)."""
    for kind in HUBS:
        hub = request.getfixturevalue(f"{kind}_backend")
        follower = request.getfixturevalue("memory_backend")
        a_url = str(request.getfixturevalue("tmp_path") / f"a-{kind}")
        a = resolve(a_url)
        b = resolve(hub.url(f"b-{kind}"), hub.storage_options)
        c = resolve(follower.url(f"c-{kind}"), follower.storage_options)
        eng, follow = hub_engine(), Engine(Executor(transfers=2, backoff=(0.001, 0.01)), State(None))
        pack(a_url, make_docs(40, 2))
        assert eng.sync_pass("ds", "a", "b", {"a": a, "b": b}).published
        assert follow.sync_pass("ds", "b", "c", {"b": b, "c": c}).published
        for round_ in range(4):
            pack(a_url, make_docs(10, 30 + round_), append=True)
            pack(a_url, make_docs(10, 40 + round_), append=True)
            assert eng.sync_pass("ds", "a", "b", {"a": a, "b": b}).published
        res = follow.sync_pass("ds", "b", "c", {"b": b, "c": c})
        assert res.ok and res.published, (kind, res)


def test_genuine_rollback_is_still_refused(tmp_path: Path) -> None:
    a_url, b_url, c_url, old_url = (str(tmp_path / n) for n in ("a", "b", "c", "old"))
    a, b = resolve(a_url), resolve(b_url)
    eng = hub_engine()
    pack(a_url, make_docs(40, 1))
    eng.sync_pass("ds", "a", "b", {"a": a, "b": b})
    old = open_dataset(a_url).version_id
    assert ferry_sync(a_url, old_url).returncode == 0  # a replica that stays at the first version
    for round_ in range(3):
        pack(a_url, make_docs(10, 50 + round_), append=True)
        eng.sync_pass("ds", "a", "b", {"a": a, "b": b})
    assert ferry_sync(b_url, c_url).returncode == 0  # C at B's newest
    assert open_dataset(old_url).version_id == old
    assert ferry_sync(old_url, b_url).returncode == 1  # B refuses to go back ...
    forced = ferry_sync(old_url, b_url, "--allow-rollback")  # ... unless forced
    assert forced.returncode == 0, forced.stderr
    refused = ferry_sync(b_url, c_url)  # C refuses to follow B back
    assert refused.returncode == 1
    assert "refusing to publish" in refused.stderr + refused.stdout
    with pytest.raises(RollbackError):
        Engine(Executor(transfers=1), State(None)).sync_pass("ds", "b", "c", {"b": b, "c": resolve(c_url)})
    assert open_dataset(c_url).version_id == open_dataset(a_url).version_id
