"""Jobs register with a real daemon (`ferry serve` in its own process) from real loaders in their own processes:
the daemon lists them, they expire when their loader dies, and a daemon that is stopped, frozen or gone
changes nothing in the stream and adds no wait to it."""

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
import pytest
from configs import Staging
from conftest import free_port
from helpers import pack, wait_until, write_serve_config

from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.format.digest import digest_bytes

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "job_loader.py"
TOKEN = "jobs-test-token"
REQUEST_TIMEOUT_S = 2.0  # ferry.client.service.jobs.REQUEST_TIMEOUT_S: a blocked request would cost this much


@contextlib.contextmanager
def serve(root: Path, staging: Staging | None = None) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`ferry serve` over clusters src → d1 under ``root``, with the API token set; (process, base URL)."""
    port = free_port()
    config = write_serve_config(root, port, staging)
    env = {**os.environ, "FERRY_API_TOKEN": TOKEN}
    log = (root / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), what="ferry serve to answer", proc=proc, timeout=60)
        yield proc, url
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=30)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_loader(
    root: Path, dataset: str, tag: str, batches: int, step_s: float, service: str | None, token: str | None = TOKEN
) -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_SERVICE_URL", "FERRY_API_TOKEN")}
    env.update(FERRY_JOB_HEARTBEAT="0.1", FERRY_JOB_NAME=f"train-{tag}")
    if service is not None:
        env["FERRY_SERVICE_URL"] = service
    if token is not None:
        env["FERRY_API_TOKEN"] = token
    progress = root / f"progress-{tag}"
    cmd = [sys.executable, str(SCRIPT), dataset, str(root / f"cache-{tag}"), str(progress), str(batches), str(step_s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, progress


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The loop's result line, with its stderr under ``"log"``."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return {**json.loads(out.strip().splitlines()[-1]), "log": err}


def batches_read(progress: Path) -> int:
    try:
        return int(progress.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def bytes_held(root: Path) -> int:
    """The bytes of every file under ``root`` now; a temporary file renamed or removed between the listing and
    its stat (the stager is working) counts as gone."""
    held = 0
    for f in root.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            if f.is_file():
                held += f.stat().st_size
    return held


def jobs(url: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/jobs", timeout=5)
    assert r.status_code == 200, r.text
    return list(r.json())


@pytest.mark.slow
def test_a_loader_registers_heartbeats_and_expires_when_killed(tmp_path: Path) -> None:
    dataset = str(tmp_path / "src" / "corpus")
    version = pack(dataset, 200).version_id
    with serve(tmp_path) as (_daemon, url):
        proc, progress = start_loader(tmp_path, dataset, "a", batches=100_000, step_s=0.01, service=url)
        try:
            listed = wait_until(
                lambda: [j for j in jobs(url) if j["position"] > 0], what="the job with a position", proc=proc
            )
            (job,) = listed
            assert job["name"] == "train-a" and (job["rank"], job["world_size"], job["batch_size"]) == (0, 1, 4)
            (src,) = job["sources"]
            assert (src["dataset"], src["cluster"], src["version"]) == ("corpus", "src", version)
            assert src["shuffle"] == "window" and src["seed"] == "7"
            first = job["position"]
            later = wait_until(lambda: [j for j in jobs(url) if j["position"] > first], what="the position to advance")
            assert later[0]["samples_per_second"] > 0 and later[0]["stats"]["batches"] > 0
            assert 0 <= later[0]["stats"]["stall_share"] <= 1
            metrics = httpx.get(url + "/metrics", timeout=5).text
            assert 'ferry_job_ranks{training_job="train-a"} 1.0' in metrics
        finally:
            proc.kill()  # no goodbye: the daemon has to notice the silence
            proc.wait(timeout=30)
        # expiry: MISSES (3) heartbeats of 0.1 s plus 2 s of slack
        wait_until(lambda: jobs(url) == [], what="the killed job to expire", timeout=30)


def test_registration_needs_the_token_and_a_refused_loader_reads_on(tmp_path: Path) -> None:
    dataset = str(tmp_path / "src" / "corpus")
    pack(dataset, 100)
    with serve(tmp_path) as (_daemon, url):
        body = {"name": "x", "rank": 0, "world_size": 1, "batch_size": 1, "phases": [{"start": 0, "quota": [1]}],
                "sources": [{"urls": [dataset], "version": "v", "seed": "0", "shuffle": "none", "window": 1,
                             "mode": "tokens", "seq_len": 8}]}  # fmt: skip
        assert httpx.post(url + "/api/v1/jobs", json=body, timeout=5).status_code == 401
        bad = {"Authorization": "Bearer wrong"}
        assert httpx.post(url + "/api/v1/jobs", json=body, headers=bad, timeout=5).status_code == 403
        proc, _ = start_loader(tmp_path, dataset, "b", batches=50, step_s=0.01, service=url, token="wrong")
        result = finish(proc)
        assert len(result["digests"]) == 50 and result["heartbeats"] == 0
        assert "daemon refused the registration: 403" in result["log"]
        assert jobs(url) == []


@pytest.mark.slow
def test_a_frozen_then_dead_daemon_changes_nothing_in_the_stream(tmp_path: Path) -> None:
    """Reference run without a daemon; then the same run while the daemon is SIGSTOPped (requests hang until their
    timeout), continued (the job comes back), then killed (connections refused): same batches, no wait that
    a blocked request would add."""
    dataset = str(tmp_path / "src" / "corpus")
    pack(dataset, 400)
    batches, step_s = 400, 0.02
    reference = finish(start_loader(tmp_path, dataset, "ref", batches, step_s, service=None)[0])
    with serve(tmp_path) as (daemon, url):
        proc, progress = start_loader(tmp_path, dataset, "run", batches, step_s, service=url)
        wait_until(lambda: [j for j in jobs(url) if j["position"] > 0], what="the job to heartbeat", proc=proc)
        daemon.send_signal(signal.SIGSTOP)
        frozen_at = batches_read(progress)
        # the loop goes on while requests to the frozen daemon wait out their timeout, more than once
        wait_until(lambda: batches_read(progress) >= frozen_at + 150, what="batches while frozen", proc=proc)
        daemon.send_signal(signal.SIGCONT)
        seen = wait_until(lambda: [j for j in jobs(url) if j["position"] > frozen_at * 4], what="heartbeats after thaw")
        assert seen[0]["name"] == "train-run"
        daemon.kill()
        daemon.wait(timeout=30)
        result = finish(proc)
    assert result["digests"] == reference["digests"]
    assert result["heartbeats"] > 0
    assert "unreachable (ReadTimeout)" in result["log"], result["log"]  # requests did hang on the frozen daemon
    # the first batch includes the dataset's first reads; after it no wait comes near a request's timeout
    assert max(result["waits_s"][1:]) < REQUEST_TIMEOUT_S / 2, max(result["waits_s"][1:])


@pytest.mark.slow
def test_the_daemon_stages_a_job_in_read_order_within_its_budget(tmp_path: Path) -> None:
    """A real loader reads [staging, cluster]: it gets the same batches as from the cluster alone, reads most
    bytes from staging, and staging never holds more than its budget, every shard in it verified."""
    dataset = str(tmp_path / "src" / "corpus")
    pack(dataset, 400)
    shards = open_dataset(dataset).manifest.shards
    total = int(sum(shards.stored_bytes))
    budget, horizon = total // 3, total // 6
    staging = tmp_path / "staging"
    batches, step_s = 300, 0.03
    reference = finish(start_loader(tmp_path, dataset, "ref", batches, step_s, service=None)[0])
    with serve(tmp_path, Staging(str(staging), budget, horizon, interval=0.05)) as (_daemon, url):
        urls = f"{staging / 'corpus'},{dataset}"
        proc, _ = start_loader(tmp_path, urls, "staged", batches, step_s, service=url)
        held, ahead = 0, 0
        while proc.poll() is None:  # bounded by the loader's run
            held = max(held, bytes_held(staging))
            ahead = max([ahead, *(j["staged_ahead_bytes"] or 0 for j in jobs(url))])
            time.sleep(0.02)
        result = finish(proc)
    assert result["digests"] == reference["digests"]
    from_staging = result["replica_bytes"].get(str(staging / "corpus"), 0)
    assert from_staging > result["replica_bytes"].get(dataset, 0), result["replica_bytes"]
    assert 0 < held <= budget
    digests = dict(zip(shards.paths, [shards[i].stored_digest for i in range(len(shards))], strict=True))
    for f in (staging / "corpus").rglob("*"):
        if f.is_file():
            rel = f.relative_to(staging / "corpus").as_posix()
            assert digest_bytes(f.read_bytes()) == digests[rel], rel
    assert ahead > 0  # the daemon said what it staged ahead of the job
