"""Three clusters, three daemons, one per cluster, sharing nothing but storage (pull model).

east, west and north are local directories. A dataset is packed at east; one rule sends
every dataset from east to every other cluster. Each cluster runs its own ``ferry serve``
(its own ferry.toml, state_dir and API port) restricted with ``cluster = "<name>"`` to
act only on its own cluster as a destination, pulling each shard from the nearest cluster
that publishes a verified copy. The test:

* SIGKILLs west's daemon while it is mid-way (shards copied, nothing published) and
  restarts it: west finishes, with no stray temp file and nothing corrupted;
* starts north once west is complete: north's nearest peer is west, so every shard
  north copies comes from west, not from the origin east;
* polls every cluster's ``manifest.json`` throughout: whenever one is published, every
  shard it names exists with the right size and digest (no partial version, ever);
* ends with ``ferry verify`` passing on all three and every daemon's API showing the whole
  dataset × cluster matrix complete (read from the peers' manifests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from configs import Api, Cluster, FerryToml, Limits, Rule
from conftest import free_port, wait_for_port

from ferry.shard_tools import PackOptions, pack_documents
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.errors import FerryError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import TEMP_MARKER, resolve

DATASET = "corpus"
CLUSTERS = ("east", "west", "north")
# Each cluster's own view of distance (lower is nearer); a daemon pulls from the nearest published copy.
PRIORITIES = {
    "east": {"east": 1, "west": 20, "north": 30},
    "west": {"west": 1, "east": 10, "north": 30},
    "north": {"north": 1, "west": 5, "east": 50},
}


def _config(root: Path, me: str, port: int, bwlimit: str | None) -> Path:
    return FerryToml(
        clusters={c: Cluster(root / c, priority=PRIORITIES[me][c]) for c in CLUSTERS},
        rules=[Rule("east", "*", datasets="*")],
        limits=Limits(transfers=2, retries=3, bwlimit=bwlimit or None),
        api=Api(host="127.0.0.1", port=port),
        cluster=me,
        state_dir=root / ("state-" + me),
        poll_interval=0.3,
    ).write(root / f"ferry-{me}.toml")


class Daemon:
    """One ``ferry serve`` subprocess with its own config and log."""

    def __init__(self, root: Path, me: str, bwlimit: str | None = None) -> None:
        self.root, self.me, self.port = root, me, free_port()
        self.config = _config(root, me, self.port, bwlimit)
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False
        self.log = root / f"serve-{me}.log"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                wait_for_port(self.port, timeout=0.2)
                return
            except TimeoutError:
                if self.proc.poll() is not None:
                    pytest.fail(f"ferry serve for {self.me} exited ({self.proc.returncode}):\n{self.tail()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"ferry serve for {self.me} is not listening after 60 s:\n{self.tail()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.killed = True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
            return json.loads(resp.read())

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


class Watcher(threading.Thread):
    """Polls every cluster's manifest.json; records any published version naming a missing or bad shard."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.seen: dict[str, set[str]] = {c: set() for c in CLUSTERS}  # versions seen published
        self.checks = 0
        self._good: set[tuple[str, str]] = set()  # (cluster, shard path) already digest-checked

    def run(self) -> None:
        while not self.stop.is_set():
            for c in CLUSTERS:
                self._check(c)
            self.checks += 1
            time.sleep(0.02)

    def _check(self, cluster: str) -> None:
        base = self.root / cluster / DATASET
        if not (base / "manifest.json").exists():
            return
        try:
            manifest = load_manifest(resolve(str(base)))
        except FerryError as exc:
            self.violations.append(f"{cluster}: unreadable manifest: {exc}")
            return
        self.seen[cluster].add(manifest.version_id)
        for info in manifest.shards:
            path = base / info.path
            if (cluster, info.path) in self._good:
                continue
            if not path.exists():
                self.violations.append(f"{cluster}: published {manifest.version_id} names missing {info.path}")
                continue
            data = path.read_bytes()
            if len(data) != info.stored_bytes or digest_bytes(data) != info.stored_digest:
                self.violations.append(f"{cluster}: published {manifest.version_id} names a bad {info.path}")
                continue
            self._good.add((cluster, info.path))


def _wait(what: str, check: Callable[[], bool], timeout: float, daemons: list[Daemon]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for d in daemons:
            if d.proc is not None and not d.killed and d.proc.poll() is not None:
                pytest.fail(f"ferry serve for {d.me} exited ({d.proc.returncode}) waiting for {what}:\n{d.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {d.me}\n{d.tail()}" for d in daemons)
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{logs}")
        time.sleep(0.02)


def _published(root: Path, cluster: str) -> str | None:
    path = root / cluster / DATASET / "manifest.json"
    return str(json.loads(path.read_bytes())["version_id"]) if path.exists() else None


def _shard_files(root: Path, cluster: str) -> list[str]:
    d = root / cluster / DATASET / "shards"
    return sorted(os.listdir(d)) if d.exists() else []


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def _has_cluster_option() -> bool:
    import dataclasses

    from ferry.service.config import Config

    return "cluster" in {f.name for f in dataclasses.fields(Config)}


@pytest.mark.slow
@pytest.mark.skipif(not _has_cluster_option(), reason="ferry.toml has no per-daemon `cluster` option yet")
def test_three_daemons_mesh_kill_restart_no_partial_version(tmp_path: Path, daemons: list[Daemon]) -> None:
    for c in CLUSTERS:
        (tmp_path / c).mkdir()
    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 60_000, size=int(rng.integers(200, 3000))) for _ in range(60)]
    result = pack_documents(
        docs, str(tmp_path / "east" / DATASET), PackOptions(vocab_size=65_536, eos_id=65_535, shard_size=8 * 1024)
    )
    version = result.version_id
    shards = result.shards
    assert shards >= 12, "enough shards to kill west mid-way"

    watcher = Watcher(tmp_path)
    watcher.start()
    try:
        east = Daemon(tmp_path, "east")
        west = Daemon(tmp_path, "west", bwlimit="64KiB/s")  # slow enough to be caught mid-way
        daemons += [east, west]
        east.start()
        west.start()

        # Mid-way: some shards verified at west, nothing published yet → SIGKILL.
        _wait(
            "west to hold a few shards",
            lambda: sum(TEMP_MARKER not in n for n in _shard_files(tmp_path, "west")) >= 3,
            60,
            daemons,
        )
        assert _published(tmp_path, "west") is None, "west finished before it could be killed mid-way"
        west.kill()
        held = [n for n in _shard_files(tmp_path, "west") if TEMP_MARKER not in n]
        assert 3 <= len(held) < shards
        assert _published(tmp_path, "north") is None  # north's daemon is not running: nobody writes there

        # Restart west (an operator lifts the limit); it re-plans from its state and finishes.
        west2 = Daemon(tmp_path, "west")
        daemons.append(west2)
        west2.start()
        _wait("west to publish", lambda: _published(tmp_path, "west") == version, 60, daemons)

        # north starts now; its nearest published peer is west.
        north = Daemon(tmp_path, "north")
        daemons.append(north)
        north.start()
        _wait("north to publish", lambda: _published(tmp_path, "north") == version, 60, daemons)
        checks = watcher.checks
        _wait("one more watcher round", lambda: watcher.checks > checks + 1, 10, daemons)
    finally:
        watcher.stop.set()
        watcher.join(10)

    assert watcher.violations == []
    assert watcher.seen == {c: {version} for c in CLUSTERS}

    # Nothing stray left behind by the kill: exactly the manifest's shards, no temp files.
    want = sorted(Path(i.path).name for i in load_manifest(resolve(str(tmp_path / "east" / DATASET))).shards)
    for c in CLUSTERS:
        assert _shard_files(tmp_path, c) == want, c

    # north pulled every shard from its nearest peer (west), none from the origin.
    history = north.get("/api/v1/history?limit=1000")
    copies = [h for h in history if h["ok"] and h["destination"] == "north"]
    assert len({h["shard"] for h in copies}) == shards
    assert {h["source"] for h in copies} == {"west"}
    # east's daemon is restricted to east (the source): it copied nothing anywhere.
    assert east.get("/api/v1/history?limit=1000") == []

    # Every daemon shows the whole matrix, complete, from the peers' manifests (within a poll or two).
    def matrix_complete(d: Daemon) -> bool:
        cells = {(c["dataset"], c["cluster"]): c for c in d.get("/api/v1/replicas")["cells"]}
        return set(cells) == {(DATASET, c) for c in CLUSTERS} and all(
            cell["published_version"] == version
            and cell["state"] in ("source", "complete")
            and cell["verified_shards"] == cell["total_shards"] == shards
            for cell in cells.values()
        )

    for d in (east, west2, north):
        _wait(f"{d.me}'s dashboard matrix to show every cluster complete", lambda d=d: matrix_complete(d), 10, daemons)

    for c in CLUSTERS:
        proc = subprocess.run(
            [sys.executable, "-m", "ferry.shard_tools.cli", "verify", "--json", str(tmp_path / c / DATASET)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, (c, proc.stdout, proc.stderr)


@pytest.mark.skipif(not _has_cluster_option(), reason="ferry.toml has no per-daemon `cluster` option yet")
def test_cluster_option_is_validated(tmp_path: Path) -> None:
    from ferry.service.config import parse_config
    from ferry.shard_tools.errors import ConfigError

    clusters = {c: Cluster(tmp_path / c) for c in CLUSTERS}
    doc = FerryToml(clusters=clusters, rules=[Rule("east", "*", datasets="*")]).doc()
    assert parse_config(doc).cluster is None  # one daemon for every destination (the one-machine setup)
    assert parse_config({**doc, "cluster": "west"}).cluster == "west"
    for bad in ("south", 3, ""):
        with pytest.raises(ConfigError, match="cluster"):
            parse_config({**doc, "cluster": bad})
