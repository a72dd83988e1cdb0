"""Preemption of a training process (torchrun restarts and Slurm preemption send SIGTERM; Ctrl-C SIGINT; the
OOM killer SIGKILL): every process of its tree ends within a bound, and the cache leases it held are released.

A real training script (``tests/scripts/loader_preempt.py``) iterates ``TokenLoader(num_workers=2)`` over a
local dataset, or over S3 (moto) through the netem proxy with every shard request hanging, so that fetches
are in flight and the workers are blocked inside a batch when the signal comes. The script runs in its own
session; the processes of its tree are found in /proc by that session id, which orphans keep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import upload_to_moto, wait_until
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from netem import Netem  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "loader_preempt.py"
# the README's bounds (workers end at once when the training process dies, within 4 s when it unwinds), with
# room for a loaded 2-core machine; without the fixes the workers outlive these bounds (for ever, with a hang)
WORKERS_GONE_S = 15.0
PROCESS_GONE_S = 60.0  # the training process itself: its interpreter's teardown (torch, pyarrow) on that machine


@pytest.fixture(scope="module")
def local_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("preempt") / "ds"), 3000, shard_size=16 << 10)


@pytest.fixture(scope="module")
def s3_url(local_url: str, moto_endpoint: str) -> str:
    return upload_to_moto(moto_endpoint, local_url, "preempt")


@pytest.fixture
def net(moto_endpoint: str) -> Iterator[Netem]:
    with Netem(moto_endpoint, rtt=0.002, conn_rate=0, total_rate=0, lifetime=300) as proxy:
        yield proxy


def tree(session: int) -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process of ``session``, orphans included."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid, _pgrp, sid = stat[stat.rindex(")") + 2 :].split()[:4]
        if int(sid) == session and state != "Z":
            out[int(entry)] = int(ppid)
    return out


def preempt(
    tmp_path: Path, url: str, sig: int, *, workers: int = 2, net: Netem | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Start the script, wait for its first batch (and, remote, for requests hanging), signal it; how long its
    workers and itself took to be gone. Whatever outlives the bounds is killed (by pid) after its stacks."""
    cache, ready = tmp_path / "cache", tmp_path / "ready"
    args = [sys.executable, str(SCRIPT), url, str(cache), str(ready), str(workers)]
    if net is not None:
        args.append(f'{{"key": "testing", "secret": "testing", "client_kwargs": {{"endpoint_url": "{net.url}"}}}}')
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip
    try:
        wait_until(ready.exists, 120, "the first batch", proc=proc)
        if net is not None:
            net.hang("/shards/", count=10**6)
            wait_until(lambda: any(r.hung for r in net.requests), 60, "a shard request hanging", proc=proc)
        before = tree(proc.pid)
        assert len(before) == 1 + workers, before
        os.kill(proc.pid, sig)
        start = time.monotonic()
        workers_s = process_s = None
        while time.monotonic() - start < PROCESS_GONE_S:
            left = tree(proc.pid)
            if workers_s is None and not set(left) - {proc.pid}:
                workers_s = time.monotonic() - start
            if not left:
                process_s = time.monotonic() - start
                break
            time.sleep(0.05)
        return {"workers_s": workers_s, "process_s": process_s, "left": tree(proc.pid), "cache": cache}
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[str]) -> None:
    """Dump the stacks of what is left of the script's tree, kill it, and print what it wrote (on failure)."""
    left = tree(proc.pid)
    for pid in left:
        os.kill(pid, signal.SIGUSR1)
    if left:
        time.sleep(1)  # faulthandler writes the stacks; a bounded pause, then they are killed either way
    for pid in tree(proc.pid):
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    print(err[-20000:], file=sys.stderr)


def assert_ended_and_released(result: dict[str, Any], url: str, bound: float = WORKERS_GONE_S) -> None:
    print(f"workers gone after {result['workers_s']} s, the process after {result['process_s']} s")
    assert result["workers_s"] is not None and result["workers_s"] < bound, result
    assert result["process_s"] is not None, result
    # every lease is released: a loader with a limit of one byte evicts every shard of the cache
    ds = TokenDataset(url, seq_len=64, cache_dir=str(result["cache"]), cache_limit=1)

    def evicted() -> bool:
        ds.cache.evict()  # the half-written download of a killed worker too, once its pid is no process's
        return not list(Path(result["cache"]).glob("*.arrow"))

    # a killed worker's pid stays taken until init reaps it (an orphan is init's to reap, not ours)
    wait_until(evicted, 15, "every cache file evicted", interval=0.1)
    ds.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_preempted_job_over_a_local_dataset_leaves_no_process(
    local_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    assert_ended_and_released(preempt(tmp_path, local_url, sig), local_url)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "env"),
    [
        (signal.SIGTERM, {}),
        (signal.SIGKILL, {}),
        (signal.SIGINT, {}),
        (signal.SIGTERM, {"PREEMPT_HANDLER": "exit"}),
    ],
    ids=["SIGTERM", "SIGKILL", "SIGINT", "SIGTERM-own-handler"],
)
def test_a_preempted_job_with_fetches_in_flight_leaves_no_process(
    local_url: str, s3_url: str, net: Netem, tmp_path: Path, sig: signal.Signals, env: dict[str, str]
) -> None:
    """The workers are blocked inside a batch (a fetch that never answers, a fetch lock another worker holds),
    where DataLoader's own check of its parent never runs; their thread pools have fetches queued."""
    assert_ended_and_released(preempt(tmp_path, s3_url, sig, net=net, env=env), local_url)


@pytest.mark.slow
def test_an_interrupted_job_without_workers_does_not_wait_for_its_fetches(
    local_url: str, s3_url: str, net: Netem, tmp_path: Path
) -> None:
    """Ctrl-C of a loop with ``num_workers=0``: the process exits without waiting for its background fetches."""
    result = preempt(tmp_path, s3_url, signal.SIGINT, workers=0, net=net)
    assert_ended_and_released(result, local_url, bound=PROCESS_GONE_S)
