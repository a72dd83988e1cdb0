"""The shard-level swarm (``[swarm] enabled``) on a real mesh in one process: one daemon per destination
(``cluster = NAME``, each its own state, executor and per-link limits), origin ``a``, peers ``b`` and ``c``
filling from it. ``c``'s own link from the origin is slow and its link from ``b`` fast, so ``c`` pulls shards
from ``b`` while ``b`` is still filling; readers at ``b`` and ``c`` only ever see a whole published version.
A peer whose verified set names a shard whose bytes rotted since is refused by the digest check and the shard
comes from the origin."""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from configs import Api, Cluster, FerryToml, Limits, Rule, toml_text
from helpers import pack, wait_until

from ferry.service import Daemon
from ferry.service.config import parse_config
from ferry.service.config_types import SwarmConfig
from ferry.service.replication.engine import Engine
from ferry.service.replication.state import State
from ferry.service.replication.swarm_set import SwarmSet, swarm_path
from ferry.service.transfer.bandwidth import Bandwidth
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve

DATASET = "corpus"
MIB = 2**20


def _docs(n: int, tokens: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(1, 999, tokens, dtype=np.uint16) for _ in range(n)]


def _daemon(root: Path, me: str, per_link: dict[str, float]) -> Daemon:
    doc = FerryToml(
        clusters={c: Cluster(root / c, priority=1 if c == "a" else 5) for c in "abc"},
        rules=[Rule("a", ["b", "c"])],
        limits=Limits(transfers=3, retries=3, per_link=per_link),
        state_dir=root / f"state-{me}",
        poll_interval=0.1,
        cluster=me,
    ).doc()
    doc["swarm"] = {"enabled": True, "interval": 0.1}
    return Daemon(parse_config(doc, base_dir=root))


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Daemon]]]:
    for c in "abc":
        (tmp_path / c).mkdir()
    rates = {"b": {"a->b": 1 * MIB, "c->b": 8 * MIB}, "c": {"a->c": 0.5 * MIB, "b->c": 8 * MIB}}
    daemons = {me: _daemon(tmp_path, me, rates[me]) for me in "bc"}
    yield tmp_path, daemons
    for d in daemons.values():
        d.stop(timeout=5)


class _Readers(threading.Thread):
    """Reads ``manifest.json`` at ``b`` and ``c`` as a reader would, over and over: whatever it names must be
    there whole and verified."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.stop, self.violations, self.seen = root, threading.Event(), [], set()

    def run(self) -> None:
        while not self.stop.is_set():
            for c in "bc":
                base = self.root / c / DATASET
                if not (base / "manifest.json").exists():
                    continue
                manifest = load_manifest(resolve(str(base)))
                self.seen.add((c, manifest.version_id))
                for info in manifest.shards:
                    data = (base / info.path).read_bytes()
                    if digest_bytes(data) != info.stored_digest:
                        self.violations.append(f"{c} publishes {info.path} with other bytes")
            time.sleep(0.02)


def _events(q: queue.Queue[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def test_peer_pulls_from_a_filling_peer_before_it_publishes(mesh: tuple[Path, dict[str, Daemon]]) -> None:
    root, daemons = mesh
    pack(str(root / "staged"), _docs(40, 40_000), shard_size=96 * 1024)  # 33 shards, ~2.4 MiB
    version = json.loads((root / "staged" / "manifest.json").read_bytes())["version_id"]
    subs = {me: d.events.subscribe(maxsize=100_000) for me, d in daemons.items()}
    readers = _Readers(root)
    readers.start()
    swarm_seen_at_b = []
    for d in daemons.values():
        d.start()
    os.rename(root / "staged", root / "a" / DATASET)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        swarm_seen_at_b.append((root / "b" / DATASET / swarm_path(version)).exists())
        if all((root / c / DATASET / "manifest.json").exists() for c in "bc"):
            break
        time.sleep(0.02)
    readers.stop.set()
    readers.join()
    events: dict[str, list[dict[str, Any]]] = {me: [] for me in subs}

    def both_published() -> bool:  # the event follows the manifest's swap by a moment
        for me, q in subs.items():
            events[me] += _events(q)
        return all(any(e["type"] == "version_published" for e in got) for got in events.values())

    wait_until(both_published, 30, "both publish events")
    b_published = min(e["ts"] for e in events["b"] if e["type"] == "version_published")
    from_b = [e for e in events["c"] if e["type"] == "shard_verified" and e["source"] == "b"]
    assert from_b, "c pulled nothing from b"
    assert min(e["ts"] for e in from_b) < b_published, "c pulled from b only after b published"
    assert any(swarm_seen_at_b), "b's verified set was never visible while it filled"
    assert not readers.violations, readers.violations[:5]
    assert readers.seen <= {("b", version), ("c", version)}
    origin = load_manifest(resolve(str(root / "a" / DATASET)))
    for c in "bc":
        for info in origin.shards:
            assert digest_bytes((root / c / DATASET / info.path).read_bytes()) == info.stored_digest
        assert not list((root / c / DATASET / "swarm").glob("*")), "a published cluster keeps its verified set"


def test_rotten_shard_at_a_filling_peer_is_refused_and_fetched_elsewhere(tmp_path: Path) -> None:
    """``b`` is filling (no manifest.json there) and says every shard is verified there, but one shard's bytes
    flipped on disk since: ``c`` pulls everything from ``b`` (the origin link is slow), refuses that one by its
    digest and takes it from the origin."""
    pack(str(tmp_path / "a" / DATASET), _docs(8, 20_000), shard_size=32 * 1024)
    src, peer, dst = (resolve(str(tmp_path / c / DATASET)) for c in "abc")
    origin = load_manifest(src)
    for info in origin.shards:
        peer.write_bytes(info.path, src.read_bytes(info.path))
    rotten = origin.shards[len(origin.shards) // 2].path
    with open(peer.full(rotten), "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    n = len(origin.shards)
    claim = SwarmSet(origin.version_id, origin.table_digest, np.ones(n, bool), np.zeros(n, bool), time.time())
    peer.write_bytes(swarm_path(origin.version_id), claim.to_bytes())
    bandwidth = Bandwidth(per_link={"a->c": 256 * 1024, "b->c": None})
    state = State(tmp_path / "state")
    try:
        engine = Engine(Executor(transfers=2, bandwidth=bandwidth, retries=2, backoff=(0.01, 0.05)), state,
                        swarm=SwarmConfig(enabled=True, interval=0.1))  # fmt: skip
        res = engine.sync_pass(DATASET, "a", "c", {"a": src, "b": peer, "c": dst})
        history = state.history(limit=1000, dataset=DATASET)
    finally:
        state.close()
    assert res.published and res.corrupt_detected == 1, res
    assert not peer.exists("manifest.json"), "the peer still publishes nothing"
    tries = [(h.shard, h.source, h.ok) for h in history]
    assert (rotten, "b", False) in tries and (rotten, "a", True) in tries, tries
    assert {s for p, s, ok in tries if ok and p != rotten} == {"b"}
    for info in origin.shards:
        assert digest_bytes(dst.read_bytes(info.path)) == info.stored_digest


def _serve(root: Path, me: str, rate: float) -> subprocess.Popen[bytes]:
    doc = FerryToml(
        clusters={c: Cluster(root / c, priority=1 if c == "a" else 5) for c in "abcd"},
        rules=[Rule("a", ["b", "c", "d"])],
        limits=Limits(transfers=4, per_link={f"{s}->{me}": rate for s in "abcd" if s != me}),
        api=Api(host="127.0.0.1", port=0),
        state_dir=root / f"state-{me}",
        poll_interval=0.2,
        cluster=me,
    ).doc()
    doc["swarm"] = {"enabled": True, "interval": 0.1, "stale_after": 2.0}
    (root / f"ferry-{me}.toml").write_text(toml_text(doc))
    argv = [sys.executable, "-m", "ferry.service.cli", "serve", "--config", str(root / f"ferry-{me}.toml")]
    with open(root / f"{me}.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.soak
def test_a_filler_killed_mid_fill_delays_its_peers_by_its_stale_time_only(tmp_path: Path) -> None:
    """Three ``ferry serve`` peers fill from ``a``; ``b`` is SIGKILLed mid-fill, its set left behind naming
    shards it was copying. ``c`` and ``d`` finish (what ``b`` held verified from ``b``, what it was copying
    elsewhere once its set is ``stale_after`` old); ``b`` restarted finishes too; every copy is whole."""
    for c in "abcd":
        (tmp_path / c).mkdir()
    pack(str(tmp_path / "staged"), _docs(48, 40_000), shard_size=64 * 1024)
    version = json.loads((tmp_path / "staged" / "manifest.json").read_bytes())["version_id"]
    procs = {me: _serve(tmp_path, me, 2 * MIB) for me in "bcd"}
    try:
        time.sleep(3.0)  # started, nothing to do
        os.rename(tmp_path / "staged", tmp_path / "a" / DATASET)
        b_set = tmp_path / "b" / DATASET / swarm_path(version)
        wait_until(lambda: _holds_some(b_set), 60, "b's set names a verified shard")
        procs["b"].send_signal(signal.SIGKILL)
        procs["b"].wait(30)
        killed = time.monotonic()

        def published(c: str) -> bool:
            return _published(tmp_path, c) == version

        wait_until(lambda: published("c") and published("d"), 60, "c and d publish")
        assert time.monotonic() - killed < 30
        procs["b"] = _serve(tmp_path, "b", 2 * MIB)
        wait_until(lambda: published("b"), 60, "b publishes after its restart")
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(30)
    origin = load_manifest(resolve(str(tmp_path / "a" / DATASET)))
    for c in "bcd":
        for info in origin.shards:
            assert digest_bytes((tmp_path / c / DATASET / info.path).read_bytes()) == info.stored_digest
        assert not list((tmp_path / c / DATASET / "swarm").glob("*"))


def _holds_some(path: Path) -> bool:
    if not path.exists():
        return False
    return any(base64.b64decode(json.loads(path.read_bytes())["verified"]))


def _published(root: Path, c: str) -> str | None:
    path = root / c / DATASET / "manifest.json"
    return str(json.loads(path.read_bytes())["version_id"]) if path.exists() else None


def test_a_peer_stuck_copying_is_waited_for_no_longer_than_its_stale_time(tmp_path: Path) -> None:
    """A live peer whose set is rewritten all the time but names every shard in flight forever (stuck, or
    lying): the filler waits ``stale_after`` of idleness, then pulls every shard from the origin."""
    pack(str(tmp_path / "a" / DATASET), _docs(4, 20_000), shard_size=32 * 1024)
    src, peer, dst = (resolve(str(tmp_path / c / DATASET)) for c in "abc")
    origin = load_manifest(src)
    n = len(origin.shards)
    stop = threading.Event()

    def stuck() -> None:
        while not stop.is_set():
            claim = SwarmSet(origin.version_id, origin.table_digest, np.zeros(n, bool), np.ones(n, bool), time.time())
            peer.write_bytes(swarm_path(origin.version_id), claim.to_bytes())
            stop.wait(0.05)

    writer = threading.Thread(target=stuck, daemon=True)
    writer.start()
    state = State(tmp_path / "state")
    got: list[Any] = []
    try:
        engine = Engine(Executor(transfers=2), state, swarm=SwarmConfig(enabled=True, interval=0.05, stale_after=1.0))
        t = threading.Thread(
            target=lambda: got.append(engine.sync_pass(DATASET, "a", "c", {"a": src, "b": peer, "c": dst}))
        )
        t0 = time.monotonic()
        t.start()
        t.join(20)
        assert not t.is_alive(), "the filler waits for the stuck peer for ever"
    finally:
        stop.set()
        writer.join()
        state.close()
    assert got and got[0].published and got[0].copied == n
    assert 1.0 <= time.monotonic() - t0 < 10


def test_publish_clears_the_verified_sets_and_retention_and_scrub_leave_them_alone(tmp_path: Path) -> None:
    pack(str(tmp_path / "a" / DATASET), _docs(2, 20_000), shard_size=32 * 1024)
    src, dst = (resolve(str(tmp_path / c / DATASET)) for c in "ac")
    dst.write_bytes(swarm_path("0" * 32), b"{}")  # a set left by a pass of another version
    for swarm in (False, True):
        state = State(tmp_path / f"state-{swarm}")
        try:
            engine = Engine(Executor(transfers=2), state, keep_versions=1, swarm=SwarmConfig(enabled=swarm))
            res = engine.sync_pass(DATASET, "a", "c", {"a": src, "c": dst})
            checked, bad, _ = engine.scrub(DATASET, "c", {"a": src, "c": dst})
        finally:
            state.close()
        assert checked == res.total_shards and not bad
        left = sorted(p.name for p in (tmp_path / "c" / DATASET / "swarm").glob("*"))
        assert left == ([] if swarm else [f"{'0' * 32}.json"])  # off: nothing of it is touched
        if not swarm:
            shutil.rmtree(tmp_path / "c" / DATASET / "shards")  # the swarm pass copies the version again
            (tmp_path / "c" / DATASET / "manifest.json").unlink()
