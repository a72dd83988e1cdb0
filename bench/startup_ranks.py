"""Job start-up on one node: N local ranks open the same large dataset together, with and without the node cache.

A synthetic manifest (``scale_manifest.publish_synthetic``: realistic columns, no shard bytes) is uploaded to a
moto S3 server behind ``netem.Netem`` (a round trip per request, a bandwidth cap per connection and in total), so
what each request costs is a remote store's and every byte read from storage passes the proxy, which counts it.
For each N, N rank processes are started, wait until all of them are ready, then each reads the manifest
(``Replicas.load_manifest``: header, then the shard table) at once:

- ``no cache``: as a job without a node cache (``cache_dir=None``): every rank reads the table from storage;
- ``node cache, cold``: an empty node cache (a job's first start on a node): one rank reads the table, the
  others wait for it and read the cached file;
- ``node cache, warm``: the table already cached (a restart on the same node): no rank reads it from storage.

Reported per (mode, N): bytes and requests the proxy saw (all, and of the table), and the ranks' start-up
(from the go signal to the manifest in memory; each rank made its S3 client and one 1-byte read, left out of the
counts, before it) as median and slowest, and the median CPU time of a rank (reading and checking the table, Arrow
decoding); plus the load average before and after. Deadlines are set far out (``deadline_floor``): on a loaded
machine a rank stalled for seconds would otherwise hedge its read to a second connection and count it twice.

Usage::

    .venv/bin/python bench/startup_ranks.py                             # 1,000,000 shards, N = 1 4 16
    .venv/bin/python bench/startup_ranks.py --shards 100000 --ranks 1 4 16 --rate-mb 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODES = ("no cache", "node cache, cold", "node cache, warm")


def rank_main(url: str, options: str, cache: str, ready: str, go: str) -> int:
    """One rank: import, say ready, wait for go, read the manifest; print its start-up and what it read."""
    from ferry.client.fetching.replicas import Replicas
    from ferry.client.stats import COUNTERS

    # deadlines far above this machine's stalls: 16 ranks starting on 2 cores must not be hedged into extra reads
    replicas = Replicas(url, json.loads(options), fetch={"deadline_floor": 300.0}, cache_dir=cache or None)
    replicas.read_range("manifest.json", 0, 1)  # the S3 client and a connection made before the clock starts
    Path(ready).touch()
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)
    t0, c0 = time.perf_counter(), time.process_time()
    manifest = replicas.load_manifest()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    read = sum(r["bytes"] for r in COUNTERS.snapshot()["replicas"].values()) - 1  # less the warm-up byte
    print(json.dumps({"seconds": seconds, "cpu": cpu, "bytes": read, "shards": len(manifest.shards)}))
    return 0


def _start_together(url: str, options: dict[str, Any], cache: str, n: int, work: Path) -> list[dict[str, Any]]:
    """N rank processes released at once; what each printed."""
    sync = Path(tempfile.mkdtemp(dir=work))
    go = sync / "go"
    args = [url, json.dumps(options), cache]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", *args, str(sync / f"ready{k}"), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(n)
    ]
    deadline = time.monotonic() + 300
    while sum((sync / f"ready{k}").exists() for k in range(n)) < n and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # a rank failed before it was ready: go now, its error is raised below
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def _upload(endpoint: str, local: str) -> str:
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
    )
    fs.mkdir("startup")
    for path in Path(local).rglob("*"):
        if path.is_file():
            fs.put_file(str(path), f"startup/ds/{path.relative_to(local).as_posix()}")
    return "s3://startup/ds"


def measure(shards: int, ranks: list[int], rtt: float, rate_mb: float, work: Path) -> dict[str, Any]:
    from netem import Netem, moto_server
    from scale_manifest import publish_synthetic

    local = str(work / "ds")
    published = publish_synthetic(local, shards)
    rows = []
    with moto_server() as upstream:
        url = _upload(upstream, local)
        rate = rate_mb * 1e6
        with Netem(upstream, rtt=rtt, conn_rate=rate, total_rate=rate, lifetime=3600) as net:
            options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": net.url}}
            for n in ranks:
                cache = work / f"cache-{n}"
                for mode in MODES:
                    if mode == "node cache, cold":
                        shutil.rmtree(cache, ignore_errors=True)
                    seen = len(net.requests)
                    out = _start_together(url, options, "" if mode == "no cache" else str(cache), n, work)
                    reqs = [r for r in net.requests[seen:] if r.method == "GET" and r.range != "bytes=0-0"]
                    table = [r for r in reqs if "/tables/" in r.path]
                    times = [o["seconds"] for o in out]
                    rows.append(
                        {
                            "mode": mode,
                            "ranks": n,
                            "storage_bytes": sum(r.body_bytes for r in reqs),
                            "table_bytes": sum(r.body_bytes for r in table),
                            "table_requests": len(table),
                            "startup_median_s": round(statistics.median(times), 3),
                            "startup_max_s": round(max(times), 3),
                            "cpu_median_s": round(statistics.median(o["cpu"] for o in out), 3),
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr)
    return {"shards": shards, "table_bytes": published["shard_table_bytes"], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--shards", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rtt", type=float, default=0.03, help="seconds added per request")
    ap.add_argument("--rate-mb", type=float, default=200.0, help="MB/s cap, per connection and in total")
    ap.add_argument("--rank", nargs=5, metavar=("URL", "OPTIONS", "CACHE", "READY", "GO"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        return rank_main(*args.rank)
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ferry-startup-") as tmp:
        result = measure(args.shards, args.ranks, args.rtt, args.rate_mb, Path(tmp))
    result.update(
        rtt_s=args.rtt,
        rate_mb_s=args.rate_mb,
        load_before=[round(x, 2) for x in before],
        load_after=[round(x, 2) for x in os.getloadavg()],
        cpus=os.cpu_count(),
    )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
