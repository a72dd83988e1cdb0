"""Crash safety with real processes: `ferry serve` SIGKILLed at random moments, restarted each time.

A poller thread reads the destination's manifest.json all along; at no observed moment may it
name a shard that is missing or does not match its digest.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from configs import Api, Cluster, FerryToml, Limits, Rule
from conftest import free_port
from helpers import documents, make_docs, pack
from helpers import wait_until as wait_for

from ferry.service.replication.engine import listing
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.errors import DatasetNotFoundError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import TEMP_MARKER, resolve


class ManifestWatcher(threading.Thread):
    """Checks, as often as it can, that every shard the destination manifest names is there and intact."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.loc = resolve(url)
        self.stop = threading.Event()
        self.polls = 0
        self.checked_versions: set[str] = set()
        self.violations: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                manifest = load_manifest(self.loc)
            except (DatasetNotFoundError, FileNotFoundError):
                time.sleep(0.01)
                continue
            self.polls += 1
            self.checked_versions.add(manifest.version_id)
            for info in manifest.shards:
                try:
                    data = self.loc.read_bytes(info.path)
                except FileNotFoundError:
                    self.violations.append(f"{manifest.version_id}: {info.path} missing")
                    continue
                if len(data) != info.stored_bytes or digest_bytes(data) != info.stored_digest:
                    self.violations.append(f"{manifest.version_id}: {info.path} does not verify")


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    docs = make_docs(2500, 31)
    first = pack(str(tmp_path / "src" / "big"), docs[:2000], {}, shard_size=4096)
    assert first.shards >= 100
    rate = first.stored_bytes / 8  # 8 s of copying in all at this rate: the kills land mid-transfer
    config = tmp_path / "ferry.toml"
    FerryToml(
        clusters={"src": Cluster(f"{tmp_path}/src"), "dst": Cluster(f"{tmp_path}/dst")},
        rules=[Rule("src", ["dst"], datasets="*")],
        limits=Limits(transfers=4, bwlimit=str(int(rate))),
        api=Api(port=free_port()),
        state_dir=f"{tmp_path}/state",
        poll_interval=0.2,
    ).write(config)
    cmd = [sys.executable, "-m", "ferry.service.cli", "serve", "--config", str(config), "--log-level", "info"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    watcher = ManifestWatcher(str(tmp_path / "dst" / "big"))
    watcher.start()
    rng = random.Random(7)
    kills = 0
    appended = False
    held: list[int] = []  # shards at the destination after each kill
    try:
        for i in range(12):
            proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
            assert proc.stderr is not None
            while "daemon started" not in proc.stderr.readline():  # start-up time varies with the load
                assert proc.poll() is None
            time.sleep(rng.uniform(0.05, 0.8))
            proc.kill()  # SIGKILL: no cleanup of any kind
            proc.wait()
            kills += 1
            held.append(len([p for p in listing(resolve(str(tmp_path / "dst" / "big"))) if p.startswith("shards/")]))
            if i == 5 and not appended:  # a new version appears at the source half-way
                pack(str(tmp_path / "src" / "big"), docs[2000:], {}, shard_size=4096, append=True)
                appended = True
        final = load_manifest(resolve(str(tmp_path / "src" / "big")))
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        dst = resolve(str(tmp_path / "dst" / "big"))

        def done() -> bool:
            try:
                return load_manifest(dst).version_id == final.version_id
            except DatasetNotFoundError:
                return False

        wait_for(done, timeout=90, what="the final version at the destination")
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        watcher.stop.set()
        watcher.join(10)
    assert kills >= 10
    total = len(load_manifest(dst).shards)
    assert sum(0 < n < total for n in held) >= 3, held  # the kills did land in the middle of syncing
    assert watcher.violations == []
    assert watcher.polls > 10
    assert documents(str(tmp_path / "dst" / "big"), {}) == [d.tolist() for d in docs]  # every shard verifies
    assert [p for p in listing(dst) if TEMP_MARKER in p] == []
    assert final.version_id in watcher.checked_versions
