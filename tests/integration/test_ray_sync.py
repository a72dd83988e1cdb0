"""``[transfer] engine = "ray"``: the daemon plans, records and publishes; the copies run as Ray tasks on
a real two-node Ray cluster of separate processes (tests/ray_cluster.py), spread over both nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from configs import Api, Cluster, FerryToml, Limits, Rule, Transfer
from contracts.writers import ROUNDS, concurrent_writers
from helpers import pack, wait_until
from ray_cluster import RayCluster, ray_cluster

from ferry.service.config import parse_config
from ferry.service.daemon import Daemon
from ferry.service.replication.planner import SourceVersion
from ferry.service.transfer.ray_copier import RayCopier
from ferry.service.transfer.transfer import verify_shard
from ferry.shard_tools import open_dataset, verify
from ferry.shard_tools.storage.store import TEMP_MARKER, resolve

pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'ferry-data[ray]')")

pytestmark = pytest.mark.slow  # a Ray cluster of two nodes takes tens of seconds to start on two cores


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster(2, cpus=2) as c:
        yield c


def _daemon(root: Path, dest: str, transfer: Transfer, limits: Limits | None = None) -> Daemon:
    doc = FerryToml(
        clusters={"src": Cluster(root / "src"), dest: Cluster(root / dest)},
        rules=[Rule("src", [dest])],
        limits=limits or Limits(transfers=4),
        transfer=transfer,
        state_dir=root / f"state-{dest}",
        poll_interval=0.2,
    ).doc()
    return Daemon(parse_config(doc, base_dir=root))


def _sync(d: Daemon, dataset: str, version: str, timeout: float = 120) -> None:
    d.start()
    try:
        wait_until(lambda: any(r.dataset == dataset and r.role == "destination" and r.published_version == version
                               for r in d.replica_matrix()), timeout=timeout, what="the replica published")  # fmt: skip
    finally:
        d.stop()


def _shard_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()}


def test_ray_engine_makes_the_replica_threads_make(cluster: RayCluster, tmp_path: Path) -> None:
    made = pack(str(tmp_path / "src" / "ds"), 600, seed=3, shard_size=16 * 1024)
    assert made.shards >= 8
    _sync(_daemon(tmp_path, "threads", Transfer(engine="threads")), "ds", made.version_id)
    ray_daemon = _daemon(tmp_path, "ray", Transfer(engine="ray", address=cluster.address))
    copier = ray_daemon.executor.copier
    assert isinstance(copier, RayCopier)
    by_node: dict[str, int] = {}
    real_close = copier.close

    def close() -> None:  # read the governor's count before the daemon's stop ends it
        by_node.update(copier.transfers_by_node())
        real_close()

    copier.close = close  # type: ignore[method-assign]
    _sync(ray_daemon, "ds", made.version_id)
    for dest in ("threads", "ray"):
        assert verify(str(tmp_path / dest / "ds")).ok
        assert open_dataset(str(tmp_path / dest / "ds")).version_id == made.version_id
    assert _shard_files(tmp_path / "ray" / "ds") == _shard_files(tmp_path / "threads" / "ds")
    # both nodes copied: the second copy goes to the node the first did not take (a node's share then follows
    # how fast it finishes its copies)
    assert len(by_node) == 2 and sum(by_node.values()) == made.shards, by_node


def test_a_ray_client_address_copies_over_the_cluster(
    cluster: RayCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``address = "ray://HOST:PORT"`` (Ray Client, a driver outside the cluster): the same replica, every
    copy a task on the cluster's nodes. Ray Client's proxy forks a server for each session, and that server
    sometimes dies at once (a gRPC fork race in Ray): here the cluster's own hook kills the first one, as
    that race does, and the daemon asks for another session."""
    # the proxy holds a failed session's answer for the session's reconnect grace period
    monkeypatch.setenv("RAY_CLIENT_RECONNECT_GRACE_PERIOD", "1")
    cluster.kill_next_session_server()
    made = pack(str(tmp_path / "src" / "ds"), 300, seed=5, shard_size=16 * 1024)
    d = _daemon(tmp_path, "client", Transfer(engine="ray", address=cluster.client_address))
    copier = d.executor.copier
    assert isinstance(copier, RayCopier)
    by_node: dict[str, int] = {}
    through_client: list[bool] = []
    real_close = copier.close

    def close() -> None:
        from ray.util.client import ray as client

        by_node.update(copier.transfers_by_node())
        through_client.append(client.is_connected())  # a Ray Client session, not a driver on a node
        real_close()

    copier.close = close  # type: ignore[method-assign]
    _sync(d, "ds", made.version_id)
    assert through_client == [True]
    assert verify(str(tmp_path / "client" / "ds")).ok
    assert open_dataset(str(tmp_path / "client" / "ds")).version_id == made.version_id
    assert sum(by_node.values()) == made.shards, by_node
    assert not cluster.session_server_trap_armed(), "no session server started while the trap was set"
    asked = [r.getMessage() for r in caplog.records if "asking ray://" in r.getMessage()]
    assert asked and asked[0].endswith("for another session (2 of 4)"), asked


def test_a_sigtermed_ray_daemon_drains_and_exits_0(cluster: RayCluster, tmp_path: Path) -> None:
    """``ferry serve`` with the Ray engine, SIGTERMed (a preemption, a rolling restart): its own handler
    stops it gracefully and it exits 0. ``ray.init`` used to replace that handler by one exiting 15 at
    once, after Ray's crash handler dumped a stack."""
    made = pack(str(tmp_path / "src" / "ds"), 200, seed=6, shard_size=16 * 1024)
    doc = FerryToml(
        clusters={"src": Cluster(tmp_path / "src"), "dst": Cluster(tmp_path / "dst")},
        rules=[Rule("src", ["dst"])],
        transfer=Transfer(engine="ray", address=cluster.address),
        api=Api(host="127.0.0.1", port=0),
        state_dir=tmp_path / "state",
        poll_interval=0.2,
    )
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "ferry.service.cli", "serve", "--config", str(doc.write(tmp_path / "ferry.toml"))]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: (tmp_path / "dst" / "ds" / "manifest.json").exists(), 120, "the replica published")
        assert open_dataset(str(tmp_path / "dst" / "ds")).version_id == made.version_id
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    text = log.read_text()
    assert "signal 15: stopping" in text and "daemon stopped" in text
    assert "SIGTERM received" not in text, text[-3000:]


def test_worker_killed_mid_copy_costs_a_retry_not_a_partial_shard(cluster: RayCluster, tmp_path: Path) -> None:
    made = pack(str(tmp_path / "src" / "ds"), 900, seed=4, shard_size=32 * 1024)
    # a low limit over every node keeps each copy running long enough that a copy is caught in the middle
    # even when each scan of /proc for the task's worker is slow on a loaded machine
    d = _daemon(tmp_path, "ray", Transfer(engine="ray", address=cluster.address, max_retries=3),
                Limits(transfers=2, bwlimit=32 * 1024))  # fmt: skip
    killed: list[int] = []
    stop = threading.Event()

    def assassin() -> None:
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline and not killed:
            for pid in cluster.task_pids("copy_task"):
                time.sleep(0.3)  # let it move some bytes first
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=assassin, daemon=True)
    thread.start()
    try:
        _sync(d, "ds", made.version_id, timeout=180)
    finally:
        stop.set()
        thread.join(5)
    assert killed, "no Ray worker was caught running copy_task"
    out = tmp_path / "ray" / "ds"
    assert verify(str(out)).ok
    named = set(open_dataset(str(out)).manifest.shards.paths)
    for rel in _shard_files(out):
        assert rel in named or TEMP_MARKER in rel, f"{rel}: neither a verified shard nor a temp object"


def test_stop_cancels_running_tasks_and_publishes_nothing(cluster: RayCluster, tmp_path: Path) -> None:
    assert pack(str(tmp_path / "src" / "ds"), 900, seed=5, shard_size=32 * 1024).shards > 4
    # 32 KiB/s: the whole copy would take about ten seconds; the daemon stops a moment into it
    d = _daemon(
        tmp_path, "ray", Transfer(engine="ray", address=cluster.address), Limits(transfers=2, bwlimit=32 * 1024)
    )
    events = d.subscribe()
    d.start()
    try:
        wait_until(lambda: d.stats().transfers_in_flight > 0 and d.stats().bytes_read > 0, timeout=120,
                   what="copies moving bytes")  # fmt: skip
    finally:
        t0 = time.monotonic()
        d.stop(timeout=0.5)  # drain half a second, then cancel
        took = time.monotonic() - t0
    assert took < 15, f"stop took {took:.1f}s: the running tasks did not hear the cancel"
    out = tmp_path / "ray" / "ds"
    assert not (out / "manifest.json").exists()
    seen = []
    while not events.empty():
        seen.append(events.get_nowait())
    assert any(e["type"] == "progress" for e in seen)  # tasks' bytes came back as progress events
    assert not any(e["type"] == "version_published" for e in seen)
    digests = {s.path: s for s in SourceVersion.of(open_dataset(str(tmp_path / "src" / "ds")).manifest).shards}
    for rel in _shard_files(out):
        if TEMP_MARKER not in rel:  # a shard under its final name is a whole, verified one
            s = digests[rel]
            assert verify_shard(resolve(str(out)), rel, s.size, s.digest) is None


def test_a_node_dying_mid_copy_costs_retries_elsewhere(cluster: RayCluster, tmp_path: Path) -> None:
    made = pack(str(tmp_path / "src" / "ds"), 900, seed=6, shard_size=32 * 1024)
    cluster.add_node(cpus=2, resources={"node3": 1})  # the node that dies; the fixture's two stay
    d = _daemon(
        tmp_path, "ray", Transfer(engine="ray", address=cluster.address), Limits(transfers=6, bwlimit=96 * 1024)
    )
    d.start()
    try:
        wait_until(lambda: cluster.task_pids("copy_task", node=2), timeout=120, what="a copy running on node 3")
        time.sleep(0.3)  # let it move some bytes
        cluster.kill_node(2)
        wait_until(lambda: any(r.published_version == made.version_id for r in d.replica_matrix()
                               if r.role == "destination"), timeout=180, what="the replica published")  # fmt: skip
    finally:
        d.stop()
    out = tmp_path / "ray" / "ds"
    assert verify(str(out)).ok
    named = set(open_dataset(str(out)).manifest.shards.paths)
    for rel in _shard_files(out):
        assert rel in named or TEMP_MARKER in rel, f"{rel}: neither a verified shard nor a temp object"


def test_pause_holds_new_tasks_and_a_new_limit_reaches_running_ones(cluster: RayCluster, tmp_path: Path) -> None:
    made = pack(str(tmp_path / "src" / "ds"), 2000, seed=7, shard_size=256 * 1024)
    assert made.shards >= 3
    # 16 KiB/s over two copies: a shard of ~190 KB would take about 20 s at this limit
    d = _daemon(
        tmp_path, "ray", Transfer(engine="ray", address=cluster.address), Limits(transfers=2, bwlimit=16 * 1024)
    )
    d.start()
    try:
        wait_until(lambda: d.stats().bytes_read > 0, timeout=120, what="copies moving bytes")
        d.pause()
        d.set_limits(bwlimit=None)  # the running copies finish at once; paused, no new one starts
        wait_until(lambda: d.stats().transfers_in_flight == 0, timeout=8, what="the running copies finishing")
        done = d.stats().transfers_ok
        time.sleep(1.5)
        assert d.stats().transfers_ok == done and d.stats().transfers_in_flight == 0
        assert done < made.shards
        d.resume()
        wait_until(lambda: any(r.published_version == made.version_id for r in d.replica_matrix()
                               if r.role == "destination"), timeout=30, what="the replica published")  # fmt: skip
    finally:
        d.stop()
    assert verify(str(tmp_path / "ray" / "ds")).ok


#: what a ``ferry`` process started by these tests needs to join the fixture's cluster
_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
#: rounds of the concurrent-writers property with Ray copies (each sync starts a Ray driver: seconds)
RAY_WRITER_ROUNDS = min(ROUNDS, 12)


def test_ferry_sync_with_the_ray_engine_copies_as_tasks_on_every_node(cluster: RayCluster, tmp_path: Path) -> None:
    made = pack(str(tmp_path / "src" / "ds"), 600, seed=8, shard_size=16 * 1024)
    assert made.shards >= 8
    argv = [sys.executable, "-m", "ferry.service.cli", "sync", str(tmp_path / "src" / "ds"), str(tmp_path / "dst"),
            "--engine", "ray", "--ray-address", cluster.address, "--transfers", "4", "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env={**os.environ, **_RAY_ENV})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["published"] and report["copied"] == made.shards
    assert len(report["copies_by_node"]) == 2 and sum(report["copies_by_node"].values()) == made.shards, report
    assert verify(str(tmp_path / "dst")).ok
    assert _shard_files(tmp_path / "dst") == _shard_files(tmp_path / "src" / "ds")
    assert "Traceback" not in done.stderr


def test_ferry_sync_with_the_ray_engine_refuses_memory_urls(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ferry.service.cli", "sync", "memory://a/ds", str(tmp_path / "dst"),
            "--engine", "ray", "--ray-address", "127.0.0.1:1"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--engine ray copies in other processes, which cannot see memory://a/ds" in done.stderr


def test_concurrent_writers_with_every_sync_copying_on_ray(cluster: RayCluster, tmp_path: Path) -> None:
    """The concurrent-writers property (appends, syncs forward and syncs trying to move back, some
    SIGKILLed), every racing ``ferry sync`` a Ray driver whose copies run as tasks on both nodes."""
    base = tmp_path / "stores"
    base.mkdir()
    synced = concurrent_writers(str(base), {}, _RAY_ENV, tmp_path, RAY_WRITER_ROUNDS,
                                sync_args=("--engine", "ray", "--ray-address", cluster.address))  # fmt: skip
    copied = [r for r in synced if r["copied"]]
    assert copied, "no racing sync copied a shard"
    assert all(sum(r["copies_by_node"].values()) >= r["copied"] for r in copied), copied


_AFTER_A_FAILED_CONNECTION = """
import socket, sys, threading
from ferry.service.transfer.bandwidth import Bandwidth
from ferry.service.transfer.ray_copier import RayCopier
from ferry.shard_tools.errors import UsageError

listener = socket.create_server(("127.0.0.1", 0))
def refuse():
    while True:
        listener.accept()[0].close()
threading.Thread(target=refuse, daemon=True).start()
try:
    RayCopier(Bandwidth(None), address=f"ray://127.0.0.1:{listener.getsockname()[1]}")
except UsageError as exc:
    print("refused:", str(exc).splitlines()[0])
copier = RayCopier(Bandwidth(None), address=sys.argv[1])
print("nodes:", len(copier._alive_nodes(1.0)))
copier.close()
"""


def test_a_failed_connection_leaves_the_process_able_to_connect(cluster: RayCluster) -> None:
    """Something listens at a ``ray://`` address but no Ray Client answers: the copier says so (UsageError),
    and the same process then connects to the real cluster (Ray's half-made client state is undone)."""
    done = subprocess.run([sys.executable, "-c", _AFTER_A_FAILED_CONNECTION, cluster.address], capture_output=True,
                          text=True, timeout=240, env={**os.environ, **_RAY_ENV})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith('refused: [transfer] engine = "ray": cannot reach the Ray cluster at ray://127.0.0.1:')
    assert lines[1] == "nodes: 2", done.stdout
