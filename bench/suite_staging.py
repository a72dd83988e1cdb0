"""Staging: a job training from a remote replica on a cold cluster, with the daemon staging its coming shards to
local disk (``[staging]``) or not, in the same run.

The remote replica is moto S3 behind the :mod:`netem` proxy (``RTT``, a bandwidth cap per connection and in
all); it is the daemon's only cluster, so the stager copies from it through the same proxy. Each job is a
runner process (``runners/staging_job.py``): one epoch of a window shuffle over ``[staging/NAME, s3://...]``,
a training step emulated by ``STEP_S`` of sleep per batch after ``SETUP_S`` of emulated model setup (the
loader is built, and the job registered, before it), a cold cache of its own. Measured:

- per job: the share of the epoch's wall time spent waiting in ``next()``, from the first step on (the first
  batch's wait included), and the epoch's wall time; staging off (no daemon) and on (a daemon started just
  before, staging empty), and warm (the staging-off job again over its filled cache: the loop's own time);
- 2 jobs x 2 ranks ("nodes": a cache directory each) on the dataset at once: the bytes the proxy sent,
  against the dataset's stored bytes (what the jobs read: every shard, in one epoch).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import RUNNERS, Context, log
from netem import Netem, free_port, moto_server

__all__ = ["run"]

BATCH, SEQ_LEN, SEED = 16, 2048, 99
STEP_S = 0.1  # one emulated training step per batch
SETUP_S = 2.0  # the model's setup between building the loader and the first step, emulated
RTT = 0.030
CONN_RATE, TOTAL_RATE = 2e6, 8e6  # bytes/s: per connection, in all
SHARD_SIZE = 1 << 20  # raw bytes per shard (--quick: a quarter)
BUCKET = "bench-staging"
NAME = "corpus"
TOKEN = "bench-staging-token"
JOB_TIMEOUT_S = 600.0
INTERVAL = 2.0  # [staging] interval: the daemon's default (a registration starts a plan at once)


def _env(ctx: Context) -> dict[str, str]:
    """The runners' and the daemon's environment: this checkout's ferry (as the caller's path has it)."""
    env = ctx.env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RUNNERS), os.environ.get("PYTHONPATH", "")) if p)
    env.update(FERRY_API_TOKEN=TOKEN, FERRY_JOB_HEARTBEAT="0.2", BENCH_S3_KEY="testing", BENCH_S3_SECRET="testing")
    env.pop("FERRY_SERVICE_URL", None)
    return env


def _pack(ctx: Context) -> Path:
    """The benchmark corpus's first input file, packed in shards of SHARD_SIZE (the same every run)."""
    from ferry.shard_tools.packer.packing import PackOptions, pack

    size = SHARD_SIZE // 4 if ctx.quick else SHARD_SIZE
    out = ctx.data / f"staging-{size >> 10}k"
    if not (out / "manifest.json").exists():
        c = ctx.corpus
        opts = PackOptions(vocab_size=c.spec.vocab_size, eos_id=c.spec.eos_id, shard_size=size, progress=False)
        pack(c.files[:1], str(out), opts)
    return out


def _upload(endpoint: str, local: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint},
                           skip_instance_cache=True)  # fmt: skip
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for path in local.rglob("*"):
        if path.is_file():
            fs.put_file(str(path), f"{BUCKET}/{NAME}/{path.relative_to(local).as_posix()}")


def _config(root: Path, proxy: str, port: int, staging: Path, budget: int) -> Path:
    options = '{ key = "$BENCH_S3_KEY", secret = "$BENCH_S3_SECRET", client_kwargs = { endpoint_url = "%s" } }'
    text = f"""state_dir = "{root / "state"}"
poll_interval = 5.0

[clusters.remote]
url = "s3://{BUCKET}"
storage_options = {options % proxy}

[clusters.local]  # the rule the daemon needs; it names no dataset: nothing is replicated, only staged
url = "{root / "cluster"}"

[[rules]]
from = "remote"
to = ["local"]
datasets = "no-such-dataset"

[api]
port = {port}

[staging]
url = "{staging}"
budget = {budget}
horizon = {budget}
interval = {INTERVAL}
"""
    path = root / "ferry.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def _daemon(ctx: Context, root: Path, proxy: str, staging: Path, budget: int) -> Iterator[str]:
    """`ferry serve` staging from the remote cluster into ``staging``; yields its URL once it answers."""
    import httpx

    port = free_port()
    config = _config(root, proxy, port, staging, budget)
    with (root / "serve.log").open("ab") as out:
        proc = subprocess.Popen([ctx.ferry_python, "-m", "ferry.shard_tools.cli", "serve", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, env=_env(ctx))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # bounded by the deadline
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ferry serve did not answer (see {root / 'serve.log'})")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _jobs(ctx: Context, net: Netem, root: Path, ranks: list[tuple[int, int, int]], service: str | None,
          *, warm: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Run ``ranks`` ((job seed, rank, world size) each) at once; their results."""
    procs = []
    for seed, rank, world in ranks:
        cache = root / f"cache-{seed}-{rank}"
        if not warm:
            shutil.rmtree(cache, ignore_errors=True)
        urls = [str(root / "staging" / NAME), f"s3://{BUCKET}/{NAME}"] if service else [f"s3://{BUCKET}/{NAME}"]
        a = {"urls": urls, "endpoint": net.url, "cache_dir": str(cache), "seed": seed, "rank": rank,
             "world_size": world, "batch_size": BATCH, "seq_len": SEQ_LEN, "step_s": STEP_S, "setup_s": SETUP_S,
             "service": service}  # fmt: skip
        env = {**_env(ctx), "FERRY_JOB_NAME": f"bench-{seed}"}
        cmd = [ctx.ferry_python, str(RUNNERS / "staging_job.py"), json.dumps(a)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        lines = stdout.strip().splitlines()
        out.append(json.loads(lines[-1]) if proc.returncode == 0 and lines else {"error": stderr[-500:]})
    return out


def _case(ctx: Context, net: Netem, root: Path, what: str, ranks: list[tuple[int, int, int]], staging: bool,
          budget: int, *, warm: bool = False) -> dict[str, Any]:  # fmt: skip
    """One case: the jobs of ``ranks`` with the daemon staging or not, and the bytes the proxy sent meanwhile."""
    shutil.rmtree(root / "staging", ignore_errors=True)
    before = net.body_bytes()
    if staging:
        with _daemon(ctx, root, net.url, root / "staging", budget) as url:
            runs = _jobs(ctx, net, root, ranks, url)
    else:
        runs = _jobs(ctx, net, root, ranks, None, warm=warm)
    res = {"what": what, "staging": staging, "warm": warm, "ranks": len(ranks), "runs": runs,
           "remote_bytes": net.body_bytes() - before}  # fmt: skip
    short = [r.get("error") or f"wait share {r['wait_share']:.4f}, epoch {r['epoch_s']:.1f} s" for r in runs]
    log(f"staging {what}: remote {res['remote_bytes'] / 1e6:.1f} MB; " + "; ".join(short))
    return res


def run(ctx: Context) -> dict[str, Any]:
    from ferry.shard_tools.dataset import open_dataset

    local = _pack(ctx)
    shards = open_dataset(str(local)).manifest.shards
    stored = int(shards.stored_bytes.sum())
    root = ctx.data / "staging-run"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    cases: list[dict[str, Any]] = []
    with moto_server(ctx.ferry_python) as upstream:
        _upload(upstream, local)
        with Netem(upstream, rtt=RTT, conn_rate=CONN_RATE, total_rate=TOTAL_RATE, lifetime=3600) as net:
            one = [(SEED, 0, 1)]
            for r in range(ctx.repeats):  # off and on alternate which goes first
                order = [False, True] if r % 2 == 0 else [True, False]
                for on in order:
                    what = "1 job, staging " + ("on" if on else "off")
                    cases.append(_case(ctx, net, root, what, one, on, 4 * stored))
            cases.append(_case(ctx, net, root, "1 job, warm cache", one, False, 4 * stored, warm=True))
            two_by_two = [(SEED + j, rank, 2) for j in range(2) for rank in range(2)]
            for on in (False, True):
                what = "2 jobs x 2 nodes, staging " + ("on" if on else "off")
                cases.append(_case(ctx, net, root, what, two_by_two, on, 4 * stored))
    return {
        "batch_size": BATCH, "seq_len": SEQ_LEN, "step_s": STEP_S, "setup_s": SETUP_S, "rtt_s": RTT,
        "link": {"conn_rate": CONN_RATE, "total_rate": TOTAL_RATE},
        "dataset": {"shards": len(shards), "stored_bytes": stored, "tokens": int(shards.tokens.sum())},
        "cases": cases,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit("run through bench/run.py --only staging")
