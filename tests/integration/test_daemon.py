"""The daemon in-process (rules, polling, events, control calls) and `ferry serve` stopping on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from configs import Api, Cluster, FerryToml, Limits, Rule
from conftest import free_port
from helpers import documents, make_docs, pack
from helpers import wait_until as wait_for

from ferry.service.config import load_config
from ferry.service.daemon import Daemon
from ferry.shard_tools.errors import ConfigError, NotFoundError
from ferry.shard_tools.storage.store import resolve


def write_config(root: Path, poll: float = 0.2) -> Path:
    return FerryToml(
        clusters={
            "src": Cluster(f"{root}/src"),
            "d1": Cluster(f"{root}/d1", priority=20),
            "d2": Cluster(f"memory://daemon-{os.getpid()}-{root.name}"),
        },
        rules=[Rule("src", ["d1", "d2"], datasets="*")],
        limits=Limits(transfers=3),
        api=Api(port=free_port()),
        state_dir=f"{root}/state",
        poll_interval=poll,
        keep_versions=2,
    ).write(root / "ferry.toml")


def complete(d: Daemon, dataset: str, version: str | None = None) -> bool:
    cells = [r for r in d.replica_matrix() if r.dataset == dataset and r.role == "destination"]
    return len(cells) == 2 and all(r.state == "complete" and (version is None or r.published_version == version)
                                   for r in cells)  # fmt: skip


def drain(q: Any) -> list[dict[str, Any]]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_daemon_replicates_and_obeys_controls(tmp_path: Path) -> None:
    alpha_docs, beta_docs = make_docs(300, 21), make_docs(200, 22)
    alpha = pack(str(tmp_path / "src" / "alpha"), alpha_docs, {})
    pack(str(tmp_path / "src" / "beta"), beta_docs, {})
    cfg = load_config(write_config(tmp_path))
    d = Daemon(cfg)
    events = d.subscribe()
    d.start()
    try:
        wait_for(lambda: complete(d, "alpha") and complete(d, "beta"), what="first sync")
        assert documents(cfg.clusters["d1"].dataset_url("alpha"), {}) == [x.tolist() for x in alpha_docs]
        assert documents(cfg.clusters["d2"].dataset_url("beta"), {}) == [x.tolist() for x in beta_docs]
        infos = {i.name: i for i in d.datasets()}
        assert set(infos) == {"alpha", "beta"} and infos["alpha"].shards == alpha.shards
        assert infos["alpha"].version == alpha.version_id and infos["alpha"].source == "src"
        cell = next(r for r in d.replica_matrix() if r.dataset == "alpha" and r.cluster == "d1")
        assert (cell.verified_shards, cell.total_shards, cell.lag_seconds) == (alpha.shards, alpha.shards, None)
        kinds = {e["type"] for e in drain(events)}
        assert {"shard_verified", "version_published", "pass"} <= kinds
        snap = d.stats()
        assert snap.transfers_ok >= 2 * alpha.shards and snap.pending_shards == 0 and snap.errors == []
        assert len(d.history(limit=5)) == 5 and d.history(dataset="beta")[0].dataset == "beta"
        assert [c.name for c in d.clusters()] == ["src", "d1", "d2"]

        # pause: a new version waits; resume: it completes
        d.pause()
        more = make_docs(100, 23)
        new = pack(str(tmp_path / "src" / "alpha"), more, {}, append=True)
        assert d.sync_now("alpha", ("src", "d1")) >= 1
        # the pass has planned the new version (the State records when it became wanted) and waits
        wait_for(lambda: [v for v in d.version_timings() if v.version == new.version_id], what="the planned version")
        assert d.paused and d.executor.paused
        assert not complete(d, "alpha", new.version_id)
        waiting = wait_for(lambda: [r for r in d.replica_matrix() if r.dataset == "alpha" and r.state == "paused"],
                           what="paused cells")  # fmt: skip
        assert waiting[0].target_version == new.version_id and (waiting[0].lag_seconds or 0) > 0
        timings = [v for v in d.version_timings() if v.dataset == "alpha" and v.version == new.version_id]
        assert timings and all(v.completed is None for v in timings)  # the State knows since when it is wanted
        d.resume()
        wait_for(lambda: complete(d, "alpha", new.version_id), what="sync after resume")
        assert documents(cfg.clusters["d2"].dataset_url("alpha"), {}) == [x.tolist() for x in alpha_docs + more]

        # limits change at run time, with precise errors
        info = d.set_limits(bwlimit="10MiB/s", per_link={"src->d1": "1MiB/s"}, transfers=2)
        assert (info.transfers, info.global_bps, info.links["src->d1"]) == (2, 10 * 2**20, 2**20)
        assert d.limits().global_bps == 10 * 2**20
        d.set_limits(bwlimit=None, per_link={"src->d1": None})
        assert d.limits().global_bps is None and d.limits().links["src->d1"] is None
        with pytest.raises(NotFoundError, match="unknown link"):
            d.set_limits(per_link={"d1->src": 5})
        with pytest.raises(ConfigError):
            d.set_limits(bwlimit="warp speed")
        with pytest.raises(NotFoundError, match="no rule replicates d2 -> d1"):
            d.sync_now(link=("d2", "d1"))

        # scrub finds a flipped byte at d1 and repairs it from a healthy replica
        d1 = resolve(cfg.clusters["d1"].dataset_url("beta"))
        victim = sorted(d1.listdir("shards"))[0]
        data = bytearray(d1.read_bytes(f"shards/{victim}"))
        data[-1] ^= 0xFF
        d1.write_bytes(f"shards/{victim}", bytes(data))
        assert d.scrub("beta", "d1") == 1
        report = wait_for(lambda: d.scrub_reports(), what="scrub report")[0]
        assert (report.dataset, report.cluster, report.bad, report.repaired) == (
            "beta", "d1", [f"shards/{victim}"], [f"shards/{victim}"])  # fmt: skip
        assert documents(cfg.clusters["d1"].dataset_url("beta"), {}) == [x.tolist() for x in beta_docs]

        # a shard missing at every replica fails alone, shows up in errors(), and retry() picks it up again
        src_alpha = resolve(cfg.clusters["src"].dataset_url("alpha"))
        third = pack(str(tmp_path / "src" / "alpha"), make_docs(50, 24), {}, append=True)
        from ferry.shard_tools.dataset import open_dataset

        lost = open_dataset(src_alpha.url).manifest.shards[-1].path
        saved = src_alpha.read_bytes(lost)
        os.remove(src_alpha.full(lost))
        d.sync_now("alpha")
        errors = wait_for(lambda: [e for e in d.errors() if e.shard == lost and e.cluster == "d2"], what="error")
        assert not errors[0].retryable and "missing" in errors[0].reason
        assert not complete(d, "alpha", third.version_id)
        src_alpha.write_bytes(lost, saved)
        assert d.retry(errors[0].id) == 1
        with pytest.raises(NotFoundError, match="no open error with id"):
            d.retry(10**9)
        d.retry()
        wait_for(lambda: complete(d, "alpha", third.version_id), what="sync after retry")
        assert d.errors() == []
    finally:
        d.stop()
    assert not d.running


def test_ferry_serve_stops_on_sigterm(tmp_path: Path) -> None:
    docs = make_docs(200, 25)
    result = pack(str(tmp_path / "src" / "gamma"), docs, {})
    config = write_config(tmp_path, poll=0.3)
    ferry = Path(sys.executable).with_name("ferry")
    proc = subprocess.Popen([str(ferry), "serve", "--config", str(config)], stderr=subprocess.PIPE, text=True)
    try:
        dst = resolve(str(tmp_path / "d1" / "gamma"))
        wait_for(lambda: dst.exists("manifest.json"), timeout=60, what="publish by ferry serve")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "daemon stopped" in err and "signal 15" in err
    assert documents(str(tmp_path / "d1" / "gamma"), {}) == [x.tolist() for x in docs]
    from ferry.service.replication.state import DB_NAME

    assert (tmp_path / "state" / DB_NAME).exists() and result.shards > 0


def test_scheduled_scrub_repairs(tmp_path: Path) -> None:
    docs = make_docs(150, 26)
    pack(str(tmp_path / "src" / "delta"), docs, {})
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("keep_versions = 2", "keep_versions = 2\nscrub_interval = 1"))
    cfg = load_config(config)
    d = Daemon(cfg)
    d.start()
    try:
        wait_for(lambda: complete(d, "delta"), what="first sync")
        d1 = resolve(cfg.clusters["d1"].dataset_url("delta"))
        victim = f"shards/{sorted(d1.listdir('shards'))[-1]}"
        data = bytearray(d1.read_bytes(victim))
        data[0] ^= 0x40
        d1.write_bytes(victim, bytes(data))
        found = wait_for(lambda: [r for r in d.scrub_reports(50) if r.cluster == "d1" and r.bad], what="a scrub")
        assert found[0].bad == [victim] and found[0].repaired == [victim]
        assert documents(cfg.clusters["d1"].dataset_url("delta"), {}) == [x.tolist() for x in docs]
        assert any(e.kind == "corrupt" and e.cluster == "d1" for e in d.stats().errors)
    finally:
        d.stop()
