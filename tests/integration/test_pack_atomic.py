"""Atomicity: a ``ferry pack`` SIGKILLed at random moments never leaves a manifest naming a missing
or partial shard, and never damages the version that was current before it started."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ferry.shard_tools import DatasetNotFoundError, FerryError, open_dataset, verify
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.storage.store import resolve

ARGS = ["--vocab-size", "50257", "--eos-id", "50256", "--name", "atomic"]


def corpus(tmp_path: Path, files: int = 10) -> list[str]:
    rng = np.random.default_rng(7)
    paths = []
    for f in range(files):
        lists = [rng.integers(0, 50_000, size=int(rng.integers(1, 800))).tolist() for _ in range(500)]
        path = tmp_path / f"in-{f:02d}.parquet"
        pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path)
        paths.append(str(path))
    return paths


def check_consistent(url: str) -> str | None:
    """None when the current manifest's shards are all present at their recorded size."""
    loc = resolve(url)
    try:
        m = load_manifest(loc)
    except DatasetNotFoundError:
        return None
    except FerryError as exc:
        return f"manifest unreadable: {exc}"
    if not loc.exists(f"versions/{m.version_id}.json"):
        return f"manifest {m.version_id} has no versions/ copy"
    for info in m.shards:
        full = Path(url) / info.path
        if not full.exists():
            return f"{info.path} missing"
        if full.stat().st_size != info.stored_bytes:
            return f"{info.path} partial"
    return None


class Poller(threading.Thread):
    """Checks the dataset over and over while a pack runs."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.problems, self.checks = url, threading.Event(), [], 0

    def run(self) -> None:
        while not self.stop.is_set():
            problem = check_consistent(self.url)
            self.checks += 1
            if problem:
                self.problems.append(problem)
            self.stop.wait(0.01)


@pytest.mark.slow
def test_sigkill_mid_pack_never_exposes_partial_version(tmp_path: Path) -> None:
    inputs = corpus(tmp_path)
    out = str(tmp_path / "ds")
    cmd = [sys.executable, "-m", "ferry.shard_tools.cli", "pack", "--out", out, *ARGS]
    # a base version, then appends killed at random moments (same seed every run)
    subprocess.run([*cmd, "--shard-size", "16KiB", inputs[0]], check=True, capture_output=True, timeout=120)
    assert len(list((Path(out) / "shards").iterdir())) > 10
    base = open_dataset(out)
    shards_dir = Path(out) / "shards"
    rng = random.Random(1234)
    poller = Poller(out)
    poller.start()
    kills = 0
    try:
        for run in range(5):
            # a different shard size per run gives new shard names, so progress is visible on disk
            size = f"{12 + 3 * run}KiB"
            before = set(shards_dir.iterdir())
            proc = subprocess.Popen(
                [*cmd, "--shard-size", size, "--append", *inputs], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            target = rng.randint(1, 150)  # kill after this many new shards (≈ 200 per full run)
            while proc.poll() is None:
                new = [p for p in set(shards_dir.iterdir()) - before if p.name.endswith(".arrow.zst")]
                if len(new) >= target:
                    break
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.02))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait(60)
            assert check_consistent(out) is None
            report = verify(out)
            assert report.ok, report.bad or report.error
    finally:
        poller.stop.set()
        poller.join(10)
    assert kills >= 4, f"only {kills} of 5 runs were killed mid-way"
    assert poller.checks > 10 and poller.problems == []
    # the base version is still published and intact
    assert verify(out, version=base.version_id).ok
    # temp files may be left behind by a killed writer, but never under a shard's final name
    leftovers = [p.name for p in (Path(out) / "shards").iterdir() if not p.name.endswith(".arrow.zst")]
    assert all(".ferry-tmp-" in n for n in leftovers)
