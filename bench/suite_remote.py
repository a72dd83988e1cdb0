"""Remote: training from object storage over a slow link — ferry vs litdata vs MosaicML, and the link's limit.

The S3 server is moto with ranged GETs answered in time proportional to the range, as S3 does
(``moto_ranged.py``; moto as shipped copies the whole object for every ranged GET).

Each tool's level-1 pack output (~64 MiB shards; ferry's packed here in stored format 3, the default, and
in format 1; the peers' from the pack suite or packed here) is uploaded to its own bucket on one moto server;
every read goes through the same :mod:`netem` proxy (per-connection and total bandwidth caps, a round trip
per request) at each RTT. Batch 16 x 2049, a simulated step of ``STEP_S``
per batch with one DataLoader worker (and, for the throughput, no step and no worker), a window shuffle
(litdata's ``shuffle=True``, MosaicML's py1e in blocks of the window's shards), cold caches bounded to
``CACHE_SHARDS`` shards; every runner (peers', limits' and floors' alike) has ``OMP_NUM_THREADS=1``, as the load
suite's (torch's intra-op threads only fight the loader for the cores). Bytes downloaded are what the proxy
sent during the run; delivered are the token
bytes of the batches (uint16). The limit: bare parallel ranged GETs of ferry's stored shards.

Streaming at the link's speed (:func:`link_cases`): three ~64 MiB shards at 30 ms, no step, cold cache, ferry
with 0 and 2 workers alternated with the limit (the same stored bytes GET in several layouts, its best one
taken) in one proxy; ferry's tokens/s after its first batch as a share of the limit's.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import suite_load
import suite_pack
from harness import RUNNERS, Context, Runner, log, run_json, summary
from netem import Netem, moto_server

__all__ = ["run"]

BATCH, SEQ_LEN, SEED = 16, 2048, 1234
STEP_S = 0.02
CACHE_SHARDS = 8  # MosaicML refuses less than 4x its largest shard counted twice (raw + zip): ~4 of ferry's
WINDOW = 2  # ferry's shuffle window
RTTS = (0.0, 0.030)
CONN_RATE, TOTAL_RATE = 40e6, 200e6
BUCKETS = {
    "ferry": "bench-ferry",
    "ferry format 1": "bench-ferry-f1",
    "litdata": "bench-litdata",
    "mosaic": "bench-mosaic",
}
# shuffle="global" over a dataset GLOBAL_OVER times the cache: frames of the default size, and small ones
GLOBAL_OVER = 50
GLOBAL_FRAMES = {
    "ferry global": 512 << 10,
    "ferry global, 32 KiB frames": 32 << 10,
    "ferry global, 4 KiB frames": 4 << 10,
}
CRASH_RETRIES = 2  # a window run that crashed (litdata's chunk eviction raises KeyError at times) runs again
HANDOFFS = {  # floors of the stall share: no data read, ready batches of the same shape
    "dataloader": "DataLoader handoff alone (floor)",
    "thread": "ready batch from a thread's queue (floor)",
}
F1 = "ferry format 1"  # the same corpus in stored format 1 (one zstd frame a shard); "ferry" is format 3, the default
# the peers' closest equivalents at the same cache: litdata's shuffle=True, MosaicML's all-to-all "naive" shuffle
GLOBAL_PEERS = {
    "litdata shuffle=True": ("litdata", {}),
    "MosaicML naive shuffle": ("mosaic", {"shuffle_algo": "naive"}),
}


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat ((0, 0) where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _cores_busy(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Cores the machine kept busy between two readings (proxy, moto server and the loader together)."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total > 0 else None


def _upload(endpoint: str, local: str, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
    )
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for path in Path(local).rglob("*"):
        if path.is_file():
            fs.put_file(str(path), f"{bucket}/ds/{path.relative_to(local).as_posix()}")


def _tools(ctx: Context) -> dict[str, tuple[Runner, str]]:
    ferry = Runner("ferry", "remote_ferry.py", ctx.ferry_python)
    # packed here in each stored format (the pack suite's output is whichever format was the default then)
    out = {"ferry": (ferry, str(_frames_dir(ctx, 512 << 10))), F1: (ferry, str(_format_1_dir(ctx)))}
    if ctx.peers_python:
        out["litdata"] = (
            Runner("litdata", "remote_litdata.py", ctx.peers_python),
            suite_pack.out_dir(ctx, "litdata", 1, 1),
        )
        out["mosaic"] = (
            Runner("mosaic", "remote_mosaic.py", ctx.peers_python),
            suite_pack.out_dir(ctx, "mosaic", 1, 1),
        )
    return out


def _ferry_objects(local: str) -> tuple[list[tuple[str, int]], int]:
    from ferry.shard_tools.dataset import open_dataset

    shards = open_dataset(local).manifest.shards
    objects = [(f"{BUCKETS['ferry']}/ds/{shards[i].path}", int(shards[i].stored_bytes)) for i in range(len(shards))]
    return objects, int(shards.tokens.sum())


def _call(ctx: Context, runner: Runner, args: dict[str, Any]) -> dict[str, Any]:
    """Run a runner with this checkout's ferry first on the path (not whichever ferry the venv installed)."""
    env = {**ctx.env(), **dict(suite_load.LOADER_ENV)}
    # then the caller's own path: a checkout whose ferry is not the venv's installed one (its .mypy-tree links)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(RUNNERS), str(ctx.repo), *inherited])
    return run_json([runner.python, str(RUNNERS / runner.script), json.dumps(args)], env, 300)


def _one(
    ctx: Context, net: Netem, tool: str, runner: Runner, step: float, rtt: float, workers: int, warm: bool = False
) -> dict[str, Any]:
    cache = ctx.data / "cache" / f"remote-{tool}"
    if not warm:
        shutil.rmtree(cache, ignore_errors=True)  # cold
    args = {
        "url": f"s3://{BUCKETS[tool]}/ds",
        "endpoint": net.url,
        "cache_dir": str(cache),
        "cache_limit": CACHE_SHARDS * suite_pack.SHARD_SIZE,
        "seq_len": SEQ_LEN,
        "batch_size": BATCH,
        "seed": SEED,
        "workers": workers,
        "step_s": step,
        "window": WINDOW,
        "max_seconds": 4.0 if ctx.quick else 10.0,
    }
    if tool == "mosaic":
        args.update(_mosaic_window(ctx))
    what = f"{tool} (warm cache)" if warm else tool
    crashes: list[str] = []
    for _ in range(1 + CRASH_RETRIES):  # a run that crashed is run again, cold; the crashes are kept
        if crashes and not warm:
            shutil.rmtree(cache, ignore_errors=True)
        before, ticks = net.body_bytes(), _cpu_ticks()
        res = _call(ctx, runner, args)
        downloaded = net.body_bytes() - before
        res["cores_busy"] = _cores_busy(ticks, _cpu_ticks())
        log(f"remote rtt={rtt * 1e3:.0f}ms step={step * 1e3:.0f}ms {what}: {res.get('error') or _short(res)}")
        if "batches" in res:
            delivered = (res["batches"] + 1) * BATCH * (SEQ_LEN + 1) * 2
            res["downloaded_bytes"] = downloaded
            res["downloaded_per_delivered"] = downloaded / delivered
            break
        crashes.append(str(res.get("error", "no result"))[-300:])
    res["crashes"] = crashes
    return res


def _mosaic_window(ctx: Context) -> dict[str, int]:
    """MosaicML's closest equivalent of a window shuffle of WINDOW shards: one canonical partition, its py1e
    shuffle in blocks of WINDOW shards' samples (its defaults, 64 partitions read at once and 256K-sample
    blocks, need many shards at a time and thrash a cache of CACHE_SHARDS shards once the dataset is larger)."""
    index = json.loads((Path(suite_pack.out_dir(ctx, "mosaic", 1, 1)) / "index.json").read_text())
    per_shard = max(int(s["samples"]) for s in index["shards"])
    return {"num_canonical_nodes": 1, "shuffle_block_size": WINDOW * per_shard}


def _frames_dir(ctx: Context, frame_size: int) -> Path:
    return ctx.data / f"remote-frames-s3-{frame_size >> 10}k"  # format 3: the format read by frames


def _handoff_args(ctx: Context) -> dict[str, Any]:
    return {"batch_size": BATCH, "seq_len": SEQ_LEN, "workers": 1, "step_s": STEP_S,
            "max_seconds": 4.0 if ctx.quick else 10.0}  # fmt: skip


def _format_1_dir(ctx: Context) -> Path:
    return ctx.data / "remote-format-1"


def _pack_frames(ctx: Context, frame_size: int) -> str:
    """The benchmark corpus packed again in stored format 3 with ``frame_size`` raw bytes per frame (0: in
    format 1, one zstd frame a shard)."""
    from ferry.shard_tools.format.seekable import DEFAULT_FRAME_SIZE
    from ferry.shard_tools.packer.packing import PackOptions, pack

    out = _frames_dir(ctx, frame_size) if frame_size else _format_1_dir(ctx)
    if not (out / "manifest.json").exists():
        c = ctx.corpus
        opts = PackOptions(
            vocab_size=c.spec.vocab_size,
            eos_id=c.spec.eos_id,
            shard_size=suite_pack.SHARD_SIZE,
            stored_format=3 if frame_size else 1,
            frame_size=frame_size or DEFAULT_FRAME_SIZE,
            progress=False,
        )
        pack(c.files, str(out), opts)
    return str(out)


def _global(
    ctx: Context, net: Netem, runner: Runner, bucket: str, step: float, rtt: float, extra: dict[str, Any]
) -> dict[str, Any]:
    """shuffle="global" (ferry: it reads frames, not shards; a peer: ``extra``, its closest) over a dataset
    GLOBAL_OVER times the cache."""
    from ferry.shard_tools.dataset import open_dataset

    raw = int(open_dataset(str(_frames_dir(ctx, 512 << 10))).manifest.shards.raw_bytes.sum())
    cache = ctx.data / "cache" / "remote-global"
    shutil.rmtree(cache, ignore_errors=True)
    args = {
        **extra,
        "url": f"s3://{bucket}/ds",
        "endpoint": net.url,
        "cache_dir": str(cache),
        "cache_limit": max(1 << 20, raw // GLOBAL_OVER),
        "seq_len": SEQ_LEN,
        "batch_size": BATCH,
        "seed": SEED,
        "workers": 1 if step else 0,
        "step_s": step,
        "max_seconds": 4.0 if ctx.quick else 10.0,
    }
    before, ticks = net.body_bytes(), _cpu_ticks()
    res = _call(ctx, runner, args)
    res["cores_busy"] = _cores_busy(ticks, _cpu_ticks())
    if "batches" in res:
        res["downloaded_bytes"] = net.body_bytes() - before
        res["downloaded_per_delivered"] = res["downloaded_bytes"] / ((res["batches"] + 1) * BATCH * (SEQ_LEN + 1) * 2)
    log(f"remote rtt={rtt * 1e3:.0f}ms step={step * 1e3:.0f}ms global {bucket}: {res.get('error') or _short(res)}")
    return res


def _global_cases(ctx: Context, upstream: str, tools: dict[str, tuple[Runner, str]]) -> list[dict[str, Any]]:
    plans: dict[str, tuple[Runner, str, dict[str, Any]]] = {}
    for what, frame_size in GLOBAL_FRAMES.items():
        bucket = BUCKETS["ferry"] if frame_size == 512 << 10 else f"bench-ferry-{frame_size >> 10}k"
        if bucket != BUCKETS["ferry"]:
            _upload(upstream, _pack_frames(ctx, frame_size), bucket)
        plans[what] = (tools["ferry"][0], bucket, {"shuffle": "global"})
    for what, (tool, extra) in GLOBAL_PEERS.items():
        if tool in tools:
            plans[what] = (tools[tool][0], BUCKETS[tool], extra)
    cases = []
    rtt = RTTS[-1]
    with Netem(upstream, rtt=rtt, conn_rate=CONN_RATE, total_rate=TOTAL_RATE, lifetime=3600) as net:
        for step in (STEP_S, 0.0):
            case: dict[str, Any] = {"rtt_s": rtt, "step_s": step, "global_over": GLOBAL_OVER, "runs": {}}
            for what, (runner, bucket, extra) in plans.items():
                case["runs"][what] = [_global(ctx, net, runner, bucket, step, rtt, extra) for _ in range(ctx.repeats)]
            case["summary"] = _summaries(case["runs"])
            cases.append(case)
    return cases


SUMMARY_KEYS = ("first_batch_s", "tokens_per_s", "stall_share", "late_stall_share", "downloaded_per_delivered",
                "peak_rss_mb", "cores_busy")  # fmt: skip


def _summaries(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per tool, the summary (median, spread) of each measure over its runs."""
    return {t: {k: summary(rs, k) for k in SUMMARY_KEYS} for t, rs in runs.items()}


def _short(res: dict[str, Any]) -> str:
    keys = SUMMARY_KEYS[:-1]  # the log line: what the run measured, without the machine's load
    return ", ".join(f"{k}={res[k]:.3g}" for k in keys if isinstance(res.get(k), (int, float)))


def _ensure_packed(ctx: Context, tools: dict[str, tuple[Runner, str]]) -> None:
    """The load suite's packing, MosaicML's through the torchvision stand-in of ``remote_mosaic.py``."""
    suite_load._ensure_packed(ctx, {t: v for t, v in tools.items() if t not in ("mosaic", "ferry", F1)})
    _pack_frames(ctx, 512 << 10)
    _pack_frames(ctx, 0)
    if "mosaic" in tools and not os.path.exists(os.path.join(tools["mosaic"][1], "index.json")):
        c = ctx.corpus
        args = {
            "inputs": c.files,
            "out": tools["mosaic"][1],
            "level": 1,
            "workers": 1,
            "shard_size": suite_pack.SHARD_SIZE,
            "vocab_size": c.spec.vocab_size,
            "eos_id": c.spec.eos_id,
            "seq_len": SEQ_LEN,
        }
        res = _call(ctx, Runner("mosaic", "remote_mosaic_pack.py", tools["mosaic"][0].python), args)
        if "error" in res:
            log(f"remote: packing for mosaic failed: {res['error']}")


LINK_SHARDS, LINK_FILE_TOKENS = 3, 33_400_000  # ~64 MiB raw shards, one per corpus file
LINK_RTT = 0.030
LINK_WORKERS = (0, 2)
LINK_BUCKET = "bench-ferry-link"
# the limit: the fastest of these (part size, connections) layouts of bare ranged GETs
LINK_LAYOUTS = [[4 << 20, 8], [8 << 20, 8], [4 << 20, 16], [16 << 20, 12]]


def _link_dataset(ctx: Context) -> str:
    """LINK_SHARDS shards of ~64 MiB (stored format 3, the default), from a corpus of their own."""
    from corpus import CorpusSpec, ensure_corpus

    from ferry.shard_tools.packer.packing import PackOptions, pack

    out = ctx.data / "remote-link"
    if not (out / "manifest.json").exists():
        spec = CorpusSpec(LINK_SHARDS * LINK_FILE_TOKENS, tokens_per_file=LINK_FILE_TOKENS)
        c = ensure_corpus(ctx.data, spec, log=False)
        opts = PackOptions(
            vocab_size=c.spec.vocab_size, eos_id=c.spec.eos_id, shard_size=suite_pack.SHARD_SIZE, progress=False
        )
        pack(c.files, str(out), opts)
    return str(out)


def link_cases(ctx: Context, upstream: str, repeats: int | None = None) -> dict[str, Any]:
    """Streaming at the link's speed: ferry (no step, cold cache, window shuffle) with 0 and 2 workers against
    the bare parallel ranged GETs of the same stored bytes, alternated in one proxy, each as a share of the
    limit's median. ``repeats``: rounds (default ``ctx.repeats``)."""
    local = _link_dataset(ctx)
    _upload(upstream, local, LINK_BUCKET)
    from ferry.shard_tools.dataset import open_dataset

    shards = open_dataset(local).manifest.shards
    objects = [(f"{LINK_BUCKET}/ds/{shards[i].path}", int(shards[i].stored_bytes)) for i in range(len(shards))]
    tokens = int(shards.tokens.sum())
    ferry = Runner("ferry", "remote_ferry.py", ctx.ferry_python)
    limit = Runner("limit", "remote_limit.py", ctx.ferry_python)
    runs: dict[str, list[dict[str, Any]]] = {}
    with Netem(upstream, rtt=LINK_RTT, conn_rate=CONN_RATE, total_rate=TOTAL_RATE, lifetime=3600) as net:
        for r in range(repeats or ctx.repeats):
            kinds = ["limit", *(f"ferry, {w} workers" for w in LINK_WORKERS)]
            for what in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                before, ticks = net.body_bytes(), _cpu_ticks()
                if what == "limit":
                    args = {"endpoint": net.url, "objects": objects, "tokens": tokens, "layouts": LINK_LAYOUTS}
                    res = _call(ctx, limit, args)
                else:
                    cache = ctx.data / "cache" / "remote-link"
                    shutil.rmtree(cache, ignore_errors=True)
                    res = _call(ctx, ferry, _link_args(net, cache, int(what.split()[1])))
                res["cores_busy"] = _cores_busy(ticks, _cpu_ticks())
                res["downloaded_bytes"] = net.body_bytes() - before
                log(f"remote link {what}: {res.get('error') or _short(res)}")
                runs.setdefault(what, []).append(res)
    lim = _limit_median(runs["limit"])
    shares = {
        what: {"of_limit": (summary(rs, "tokens_per_s") or {}).get("median", 0.0) / lim if lim else None}
        for what, rs in runs.items()
        if what != "limit"
    }
    return {"rtt_s": LINK_RTT, "shards": len(shards), "stored_bytes": int(shards.stored_bytes.sum()),
            "tokens": tokens, "runs": runs, "summary": _summaries(runs), "shares": shares,
            "limit_tokens_per_s": lim}  # fmt: skip


def _limit_median(runs: list[dict[str, Any]]) -> float | None:
    """The limit's tokens/s: the median over the runs of the layout with the best median (not the best layout of
    each run, which would pick the luckiest of several samples on a busy machine)."""
    seconds: dict[tuple[int, int], list[float]] = {}
    for r in runs:
        for lay in r.get("layouts", []):
            seconds.setdefault((lay["part_size"], lay["connections"]), []).append(lay["seconds"])
    tokens = next((r["tokens"] for r in runs if "tokens" in r), None)
    if not seconds or tokens is None:
        return (summary(runs, "tokens_per_s") or {}).get("median")
    return float(tokens) / min(statistics.median(v) for v in seconds.values())


def _link_args(net: Netem, cache: Path, workers: int) -> dict[str, Any]:
    return {
        "url": f"s3://{LINK_BUCKET}/ds",
        "endpoint": net.url,
        "cache_dir": str(cache),
        "cache_limit": 4 * LINK_SHARDS * suite_pack.SHARD_SIZE,
        "seq_len": SEQ_LEN,
        "batch_size": BATCH,
        "seed": SEED,
        "workers": workers,
        "step_s": 0.0,
        "window": WINDOW,
        "max_seconds": 60.0,  # one epoch: the run ends with the data
    }


def run(ctx: Context) -> dict[str, Any]:
    tools = _tools(ctx)
    _ensure_packed(ctx, tools)
    limit = Runner("limit", "remote_limit.py", ctx.ferry_python)
    cases: list[dict[str, Any]] = []
    with moto_server(ctx.ferry_python) as upstream:
        for tool, (_runner, local) in tools.items():
            _upload(upstream, local, BUCKETS[tool])
        objects, tokens = _ferry_objects(tools["ferry"][1])
        for rtt in RTTS:
            with Netem(upstream, rtt=rtt, conn_rate=CONN_RATE, total_rate=TOTAL_RATE, lifetime=3600) as net:
                for step in (STEP_S, 0.0):
                    case: dict[str, Any] = {"rtt_s": rtt, "step_s": step, "runs": {}}
                    for r in range(ctx.repeats):
                        order = list(tools)[r % len(tools) :] + list(tools)[: r % len(tools)]
                        for tool in order:
                            # with a step, one DataLoader worker builds batches while the loop "trains"
                            res = _one(ctx, net, tool, tools[tool][0], step, rtt, 1 if step else 0)
                            case["runs"].setdefault(tool, []).append(res)
                    if step and "ferry" in tools:  # the same again from the warm cache: the loop's own cost
                        res = _one(ctx, net, "ferry", tools["ferry"][0], step, rtt, 1, warm=True)
                        case["runs"]["ferry (warm cache)"] = [res]
                        # floors: ready batches handed over by a DataLoader worker, or taken from a thread's queue
                        for via, what in HANDOFFS.items():
                            res = _call(ctx, Runner("handoff", "remote_handoff.py", ctx.ferry_python),
                                        {**_handoff_args(ctx), "via": via})  # fmt: skip
                            log(f"remote step={step * 1e3:.0f}ms {what}: {res.get('error') or _short(res)}")
                            case["runs"][what] = [res]
                    case["summary"] = _summaries(case["runs"])
                    cases.append(case)
                lim = _call(ctx, limit, {"endpoint": net.url, "objects": objects, "tokens": tokens, "connections": 8})
                log(f"remote rtt={rtt * 1e3:.0f}ms limit: {lim.get('error') or _short(lim)}")
                cases.append({"rtt_s": rtt, "limit": lim})
        global_cases = _global_cases(ctx, upstream, tools)
        streaming = link_cases(ctx, upstream)
    return {
        "batch_size": BATCH,
        "seq_len": SEQ_LEN,
        "cache_shards": CACHE_SHARDS,
        "shard_size": suite_pack.SHARD_SIZE,
        "link": {"conn_rate": CONN_RATE, "total_rate": TOTAL_RATE},
        "cases": cases,
        "global": global_cases,
        "streaming": streaming,
    }
