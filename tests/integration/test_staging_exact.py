"""Staging changes nothing in what a job reads, with real processes: `ferry serve` staging for real loaders that
read ``[staging, cluster]``. Every job's stream equals its stream without a daemon, also when the daemon is
SIGKILLed while it stages and started again; a job that re-plans (new mixture weights, from its saved state)
tells the daemon its new plan, and the stager stages the shards of the new order."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from configs import Staging
from conftest import free_port
from helpers import pack, wait_until, write_serve_config

from ferry.client.stream.dataset import TokenDataset
from ferry.client.stream.loader import TokenLoader
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import TEMP_MARKER

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "staging_job.py"
TOKEN = "staging-test-token"


def start_daemon(root: Path, port: int, staging: Staging) -> subprocess.Popen[bytes]:
    config = write_serve_config(root, port, staging)
    log = (root / "serve.log").open("ab")
    env = {**os.environ, "FERRY_API_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    log.close()
    wait_until(lambda: _ready(port), what="ferry serve to answer", proc=proc, timeout=60)
    return proc


@contextlib.contextmanager
def daemon(root: Path, staging: Staging) -> Iterator[tuple[list[subprocess.Popen[bytes]], str]]:
    """A daemon on a port of its own; the list holds it (a test that restarts it appends the new process)."""
    port = free_port()
    procs = [start_daemon(root, port, staging)]
    try:
        yield procs, f"http://127.0.0.1:{port}"
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=30)


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def jobs(url: str) -> list[dict[str, Any]]:
    try:
        r = httpx.get(url + "/api/v1/jobs", timeout=5)
    except httpx.HTTPError:
        return []
    return list(r.json()) if r.status_code == 200 else []


def start_job(root: Path, tag: str, service: str | None, **spec: Any) -> tuple[subprocess.Popen[str], Path]:
    spec = {"seed": 7, "weights": [1], "step_s": 0.0, "cache": str(root / f"cache-{tag}"),
            "progress": str(root / f"progress-{tag}"), **spec}  # fmt: skip
    (root / f"spec-{tag}.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_SERVICE_URL", "FERRY_API_TOKEN")}
    env.update(FERRY_JOB_HEARTBEAT="0.1", FERRY_JOB_NAME=f"train-{tag}", FERRY_API_TOKEN=TOKEN)
    if service is not None:
        env["FERRY_SERVICE_URL"] = service
    cmd = [sys.executable, str(SCRIPT), str(root / f"spec-{tag}.json")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), Path(
        spec["progress"]
    )


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


def run_job(root: Path, tag: str, service: str | None = None, **spec: Any) -> dict[str, Any]:
    return finish(start_job(root, tag, service, **spec)[0])


def batches_read(progress: Path) -> int:
    try:
        return int(progress.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def staged_files(staging: Path) -> dict[str, Path]:
    """Every file of a staged dataset (``staging/NAME/...``) by its path below ``staging`` (not the lease)."""
    found = {f.relative_to(staging).as_posix(): f for f in staging.rglob("*") if f.is_file()}
    return {rel: f for rel, f in found.items() if "/" in rel}


def assert_verified(staging: Path, datasets: dict[str, str]) -> None:
    """Every file in staging is a whole shard of its dataset (no torn copy, no leftover temp file)."""
    digests = {}
    for name, url in datasets.items():
        t = open_dataset(url).manifest.shards
        digests.update({f"{name}/{t.paths[i]}": t[i].stored_digest for i in range(len(t))})
    for rel, f in staged_files(staging).items():
        assert TEMP_MARKER not in rel, f"leftover temp file {rel}"
        assert digest_bytes(f.read_bytes()) == digests[rel], rel


@pytest.mark.slow
def test_every_job_reads_the_same_stream_with_staging_and_across_a_daemon_killed_mid_staging(tmp_path: Path) -> None:
    """Two jobs at once (a mixture and one dataset); the daemon is SIGKILLed while it stages for them and started
    again on the same port and staging location: both streams equal their runs without a daemon, the jobs
    register with the new daemon, which adopts what the first one staged."""
    a, b = str(tmp_path / "src" / "a"), str(tmp_path / "src" / "b")
    pack(a, 400, shard_size=4096)
    pack(b, 300, seed=3, shard_size=4096)
    staging = tmp_path / "staging"
    mix = {"sources": [[str(staging / "a"), a], [str(staging / "b"), b]], "weights": [2, 1], "batches": 400}
    one = {"sources": [[str(staging / "a"), a]], "seed": 11, "batches": 400}
    reference = {tag: run_job(tmp_path, f"ref-{tag}", **spec) for tag, spec in (("mix", mix), ("one", one))}
    total = sum(int(open_dataset(u).manifest.shards.stored_bytes.sum()) for u in (a, b))
    config = Staging(str(staging), total // 2, total // 8, interval=0.05)

    def registered() -> list[str]:
        return sorted(j["name"] for j in jobs(url) if j["position"] > 0)

    with daemon(tmp_path, config) as (procs, url):
        specs = {tag: {**spec, "hold": str(tmp_path / f"hold-{tag}")} for tag, spec in (("mix", mix), ("one", one))}
        running = {tag: start_job(tmp_path, tag, url, step_s=0.02, **spec) for tag, spec in specs.items()}
        for proc, _ in running.values():  # both registered and something staged for them
            wait_until(lambda: len([j for j in jobs(url) if j["staged_ahead_bytes"]]) == 2, what="staging", proc=proc)
        for tag in specs:  # the jobs wait mid-run until both registered with the new daemon, however slow it starts
            (tmp_path / f"hold-{tag}").touch()
        progress = {tag: batches_read(p) for tag, (_, p) in running.items()}
        assert all(n < 300 for n in progress.values()), progress  # the jobs are mid-run
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=30)
        procs.append(start_daemon(tmp_path, int(url.rsplit(":", 1)[1]), config))
        # each job registers on its own next heartbeat: wait for both, not the first
        wait_until(lambda: len(registered()) == 2, what="both jobs to register again", timeout=30)
        assert registered() == ["train-mix", "train-one"]
        for tag in specs:
            (tmp_path / f"hold-{tag}").unlink()
        results = {tag: finish(proc) for tag, (proc, _) in running.items()}
    for tag, result in results.items():
        assert result["digests"] == reference[tag]["digests"], tag
        assert result["heartbeats"] > 0
    read = {u: n for r in results.values() for u, n in r["replica_bytes"].items()}
    assert read.get(str(staging / "a"), 0) > 0 and read.get(str(staging / "b"), 0) > 0, read
    assert_verified(staging, {"a": a, "b": b})


def loader_order(ds: Any, position: int, count: int) -> list[tuple[str, str]]:
    """The shards a mixture ``ds`` reads from ``position`` on, in order of first read (the loader's own math)."""
    src, idx = ds.schedule.locate(np.arange(position, position + count, dtype=np.int64))
    out: dict[tuple[str, str], None] = {}
    for j, i in zip(src.tolist(), idx.tolist(), strict=True):
        part = ds.source_at(j)
        name = Path(part.replicas.names[-1]).name
        for s in part.shards_of(np.asarray([i])):
            out[(name, part.manifest.shards.paths[s])] = None
    return list(out)


def first_within(order: list[tuple[str, str]], sizes: dict[tuple[str, str], int], horizon: int) -> set[str]:
    """The first shards of ``order`` until they hold ``horizon`` bytes, as paths below the staging location."""
    out, total = set(), 0
    for key in order:
        out.add(f"{key[0]}/{key[1]}")
        total += sizes[key]
        if total >= horizon:
            break
    return out


def expected_after_replan(tmp_path: Path, sources: list[list[str]], weights: list[int], state: Path) -> list[Any]:
    """The shards the loader of ``weights`` reads after loading ``state`` with replan=True, in read order."""
    parts = [
        TokenDataset(
            urls[-1],
            seq_len=32,
            seed=7 + k,
            shuffle="window",
            window=2,
            cache_dir=str(tmp_path / f"expect-{k}-{weights}"),
        )  # fmt: skip
        for k, urls in enumerate(sources)
    ]
    loader = TokenLoader(TokenDataset.mix(parts, weights), batch_size=4, service=False)
    try:
        loader.load_state_dict(json.loads(state.read_text()), replan=True)
        return loader_order(loader.dataset, loader.position, 4000)
    finally:
        for p in parts:
            p.close()


@pytest.mark.slow
def test_a_replanned_job_tells_the_daemon_and_the_stager_follows_its_new_order(tmp_path: Path) -> None:
    a, b = str(tmp_path / "src" / "a"), str(tmp_path / "src" / "b")
    pack(a, 300, shard_size=2048)
    pack(b, 300, seed=3, shard_size=2048)
    staging = tmp_path / "staging"
    sources = [[str(staging / "a"), a], [str(staging / "b"), b]]
    state = tmp_path / "state.json"
    run_job(tmp_path, "first", sources=sources, weights=[3, 1], batches=40, save=str(state))
    after = {"sources": sources, "weights": [1, 3], "batches": 120, "resume": str(state)}
    reference = run_job(tmp_path, "ref", **after)

    sizes = {}
    for name, url in (("a", a), ("b", b)):
        t = open_dataset(url).manifest.shards
        sizes.update({(name, t.paths[i]): int(t.stored_bytes[i]) for i in range(len(t))})
    horizon = 5 * max(sizes.values())
    new = first_within(expected_after_replan(tmp_path, sources, [1, 3], state), sizes, horizon)
    old = first_within(expected_after_replan(tmp_path, sources, [3, 1], state), sizes, horizon)
    assert new != old  # the re-plan changes what the job reads next

    ready, go = tmp_path / "ready.json", tmp_path / "go"
    with daemon(tmp_path, Staging(str(staging), sum(sizes.values()), horizon, interval=0.05)) as (_procs, url):
        proc, _ = start_job(tmp_path, "replan", url, ready=str(ready), go=str(go), **after)
        wait_until(ready.exists, what="the job to re-plan", proc=proc, timeout=60)
        job = json.loads(ready.read_text())
        listed = wait_until(lambda: [j for j in jobs(url) if j["id"] == job["job"] and j["phases"] > 1],
                            what="the new plan on a heartbeat", proc=proc, timeout=30)  # fmt: skip
        assert listed[0]["position"] == job["position"] > 0  # the same job, where the state left off
        deadline = time.monotonic() + 30
        while set(staged_files(staging)) != new and time.monotonic() < deadline:  # bounded: 30 s
            time.sleep(0.05)
        assert set(staged_files(staging)) == new  # the new order's first shards, the configured plan's evicted
        go.touch()
        result = finish(proc)
    assert result["digests"] == reference["digests"]
    assert result["replica_bytes"].get(str(staging / "b"), 0) > 0
