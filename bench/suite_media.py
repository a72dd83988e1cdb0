"""Multimodal: image–text pairs decoded and delivered to a training loop — ferry vs MosaicML (MDS, ``jpeg``
column) vs litdata vs Megatron-Energon on the same generated set.

The set: ``SAMPLES`` JPEGs (smooth random pictures with a little noise, sides 192–320 px, quality 90) with
captions of 60–240 characters, written once as WebDataset tars (ferry's input), as MDS shards and as litdata
chunks (each peer's own writer), and as WebDataset tars cut at the shard size with Energon's ``.nv-meta`` made by
``energon prepare``; shards of ``suite_pack.SHARD_SIZE`` for every tool (ferry's packer cuts shards within an
input file, so its input tars hold ``PER_TAR`` pairs, more than a shard). ferry packs with
``--tokenizer bytes`` and the ``patch`` policy in frames of ``FRAME_SIZE`` (``MediaLoader``: ``FERRY_BATCH``
sequences of ``SEQ_LEN`` tokens, about the peers' batch of ``BATCH`` pairs); the peers deliver batches of
``BATCH`` pairs. Every tool decodes with the same Pillow call in its DataLoader workers (2), with
``OMP_NUM_THREADS=1``. Measures:

- samples/s: decoded image–text pairs per second, warm (after a first run), 2 workers, local data;
- first batch, cold: a fresh cache (litdata copies its chunks into its cache; MosaicML, Energon and ferry read a
  local dataset in place), from the loader's construction;
- peak RSS: the runner plus its workers, the sum of each process's peak;
- remote: each tool's output in its own bucket on one moto server, read through the :mod:`netem` proxy at
  ``RTT`` with cold caches: the first batch, samples/s, and bytes downloaded per byte delivered (delivered: the
  JPEG and caption bytes of the pairs the loop received).
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import suite_pack
from harness import Context, Runner, alternate, log, summary
from netem import Netem, moto_server
from suite_load import LOADER_ENV
from suite_remote import CONN_RATE, TOTAL_RATE, _upload

__all__ = ["run"]

SAMPLES, QUICK_SAMPLES = 6000, 600
PER_TAR = 10_000  # pairs per tar: the whole set in one, so ferry's shards are cut at SHARD_SIZE as the peers'
BATCH, WORKERS, SEED = 32, 2, 1234
SEQ_LEN, FERRY_BATCH = 4096, 4
POLICY = "patch:max_side=448,patch=14"
FRAME_SIZE = 16 << 10  # ferry's frames about one image's size: a sample read from S3 fetches little beyond its own
RTT = 0.030
REMOTE_SAMPLES, QUICK_REMOTE_SAMPLES = 1500, 300  # each remote pass: the first samples of the same shuffle
BUCKETS = {"ferry": "media-ferry", "litdata": "media-litdata", "mosaic": "media-mosaic", "energon": "media-energon"}
# Energon's shuffle (the values of its quickstart): the shards cut into slices of at most this many samples, read in
# a seeded order, through a seeded shuffle buffer of this many samples
ENERGON_SHUFFLE_BUFFER, ENERGON_SAMPLES_PER_SEQUENCE = 100, 100
ENERGON = (  # stated on the page
    "WebDataset tars of the same pairs (`KEY.jpg` + `KEY.txt`) cut at the same shard size (each member takes a "
    "512-byte header and is padded to 512 bytes: about 1.6 kB a pair more than the other tools' shards, which "
    "remote reads download too), prepared by "
    "`energon prepare --non-interactive --split-ratio 1,0,0 --sample-type CaptioningSample --field-map "
    '\'{"image": "jpg", "caption": "txt"}\'`; read by `get_train_dataset` + `get_loader` (`WorkerConfig` of '
    f"{WORKERS} workers, `seed_offset` the seed; batches of {BATCH}; shuffle buffer {ENERGON_SHUFFLE_BUFFER}, "
    f"`max_samples_per_sequence` {ENERGON_SAMPLES_PER_SEQUENCE}, its quickstart's values). Its task encoder sets "
    "`decoder = None`, so Energon hands over each JPEG's bytes and the shared Pillow decode runs in its "
    "`encode_sample`, in the workers. Remote: an `msc://` path through a multi-storage-client S3 profile at the "
    "proxy's endpoint, MSC's cache (cache lines of its default 64 MiB: a whole shard) in the node-local cache "
    "directory, `check_source_version: false` (with MSC's default every ranged read of a tar member first sends a "
    "HEAD: one round trip more per member). Two workers that first read a shard at once both download it: MSC "
    "renames the one cache line of an object smaller than a line to the object's own name, so the worker that "
    "waited on the line's lock finds no line and fetches it again; downloaded ÷ delivered counts that."
)
KEYS = ("samples_per_s", "first_batch_s", "peak_rss_total_mb", "samples_per_cpu_s")


def _picture(rng: Any, i: int) -> tuple[bytes, str]:
    import numpy as np
    from PIL import Image

    w, h = 192 + (i * 37) % 129, 192 + (i * 53) % 129
    coarse = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (h, w, 3), dtype=np.int16)
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    words = ["a", "photo", "of", "the", "red", "small", "dog", "on", "grass", "near", "blue", "house", "at", "noon"]
    caption = " ".join(words[j] for j in rng.integers(0, len(words), 12 + i % 36))
    return out.getvalue(), caption


def _corpus(ctx: Context) -> dict[str, Any]:
    """The JPEGs and captions (files, for the peers' writers) and the same as WebDataset tars (ferry's input)."""
    n = QUICK_SAMPLES if ctx.quick else SAMPLES
    root = ctx.data / f"media-{n}-tars-of-{PER_TAR}"
    done = root / "corpus.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    import numpy as np

    shutil.rmtree(root, ignore_errors=True)
    (root / "jpg").mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    items, tars, nbytes = [], [], 0
    for t in range(0, n, PER_TAR):
        tar_path = root / f"pairs-{t // PER_TAR:04d}.tar"
        with tarfile.open(tar_path, "w") as tar:
            for i in range(t, min(n, t + PER_TAR)):
                data, caption = _picture(rng, i)
                path = root / "jpg" / f"{i:06d}.jpg"
                path.write_bytes(data)
                items.append([str(path), caption])
                nbytes += len(data) + len(caption.encode())
                for ext, blob in (("jpg", data), ("txt", caption.encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
        tars.append(str(tar_path))
    (root / "items.json").write_text(json.dumps(items))
    corpus = {"root": str(root), "samples": n, "tars": tars, "items": str(root / "items.json"),
              "bytes_per_sample": nbytes / n}  # fmt: skip
    done.write_text(json.dumps(corpus))
    return corpus


def _pack(ctx: Context, corpus: dict[str, Any]) -> dict[str, str]:
    """Each tool's dataset (made once): tool -> its directory."""
    from ferry.shard_tools.packer.packing import PackOptions, pack

    root = Path(corpus["root"])
    out = {"ferry": str(root / f"ferry-{suite_pack.SHARD_SIZE >> 20}m")}  # the peers' shard size
    if not (Path(out["ferry"]) / "manifest.json").exists():
        opts = PackOptions(tokenizer="bytes", media_policy=POLICY, frame_size=FRAME_SIZE,
                           shard_size=suite_pack.SHARD_SIZE, progress=False)  # fmt: skip
        pack(corpus["tars"], out["ferry"], opts)
    if ctx.peers_python:
        for tool, marker in (("mosaic", "index.json"), ("litdata", "index.json"), ("energon", ".nv-meta/dataset.yaml")):
            path = root / tool
            if not (path / marker).exists():
                shutil.rmtree(path, ignore_errors=True)
                res = Runner(tool, "peers_media_pack.py", ctx.peers_python)(
                    ctx, {"tool": tool, "items": corpus["items"], "out": str(path), "shard_size": suite_pack.SHARD_SIZE}
                )
                if "error" in res:
                    log(f"media: packing for {tool} failed: {res['error']}")
                    continue
            out[tool] = str(path)
    return out


def _runners(ctx: Context, tools: dict[str, str]) -> dict[str, Runner]:
    scripts = {"ferry": ("ferry_media.py", ctx.ferry_python)}
    if ctx.peers_python:
        scripts |= {
            "mosaic": ("mosaic_media.py", ctx.peers_python),
            "litdata": ("litdata_media.py", ctx.peers_python),
            "energon": ("energon_media.py", ctx.peers_python),
        }
    return {t: Runner(t, s, py, LOADER_ENV) for t, (s, py) in scripts.items() if t in tools}


def _args(ctx: Context, tool: str, data: str, cache: Path) -> dict[str, Any]:
    ferry = tool == "ferry"
    extra: dict[str, Any] = {}
    if tool == "energon":
        extra = {"shuffle_buffer": ENERGON_SHUFFLE_BUFFER, "samples_per_sequence": ENERGON_SAMPLES_PER_SEQUENCE}
    return {
        **extra,
        "data": data,
        "cache_dir": str(cache),
        "seq_len": SEQ_LEN,
        "batch_size": FERRY_BATCH if ferry else BATCH,
        "seed": SEED,
        "workers": WORKERS,
        "max_seconds": 3.0 if ctx.quick else 8.0,
        "min_batches": 5,
    }


def _local(ctx: Context, tools: dict[str, str], runners: dict[str, Runner]) -> dict[str, Any]:
    cold: dict[str, dict[str, Any]] = {}
    for t, runner in runners.items():
        cache = ctx.data / "cache" / f"media-{t}"
        shutil.rmtree(cache, ignore_errors=True)
        cold[t] = runner(ctx, {**_args(ctx, t, tools[t], cache), "max_seconds": 0.5}, timeout=600)
        log(f"media cold {t}: {cold[t].get('error') or round(cold[t].get('first_batch_s', 0), 3)}")

    def one(tool: str, _r: int) -> dict[str, Any]:
        return runners[tool](ctx, _args(ctx, tool, tools[tool], ctx.data / "cache" / f"media-{tool}"), timeout=600)

    runs = alternate(ctx, list(runners), one, what="media w2")
    return {"cold": cold, "runs": runs, "summary": {t: {k: summary(rs, k) for k in KEYS} for t, rs in runs.items()}}


def _remote_pass(ctx: Context, net: Netem, runner: Runner, args: dict[str, Any], per_sample: float) -> dict[str, Any]:
    before = net.body_bytes()
    res = runner(ctx, args, timeout=300)
    if "delivered_samples" in res:
        res["downloaded_bytes"] = net.body_bytes() - before
        res["downloaded_per_delivered"] = res["downloaded_bytes"] / (res["delivered_samples"] * per_sample)
    return res


def _remote(ctx: Context, tools: dict[str, str], runners: dict[str, Runner], per_sample: float) -> dict[str, Any]:
    """Per tool and repeat: a cold pass (an empty cache) over the first ``REMOTE_SAMPLES`` of the shuffle, then a
    second pass over the same samples by a new process with the cache the first one left (a restarted job, or
    the next job on the node)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    warm: dict[str, list[dict[str, Any]]] = {}
    n = QUICK_REMOTE_SAMPLES if ctx.quick else REMOTE_SAMPLES
    with moto_server(ctx.ferry_python) as upstream:
        for tool in runners:
            _upload(upstream, tools[tool], BUCKETS[tool])
        with Netem(upstream, rtt=RTT, conn_rate=CONN_RATE, total_rate=TOTAL_RATE, lifetime=3600) as net:
            for r in range(ctx.repeats):
                for tool in list(runners)[r % len(runners) :] + list(runners)[: r % len(runners)]:
                    cache = ctx.data / "cache" / f"media-remote-{tool}"
                    shutil.rmtree(cache, ignore_errors=True)
                    args = {**_args(ctx, tool, f"s3://{BUCKETS[tool]}/ds", cache), "endpoint": net.url,
                            "max_samples": n, "max_seconds": 120.0}  # fmt: skip
                    for what, into in (("cold", runs), ("warm", warm)):
                        res = _remote_pass(ctx, net, runners[tool], args, per_sample)
                        log(f"media remote {what} {tool}: {res.get('error') or _short(res)}")
                        into.setdefault(tool, []).append(res)
                    shutil.rmtree(cache, ignore_errors=True)
            limit = _get_limit(ctx, net.url, tools["ferry"])
    keys = ("first_batch_s", "samples_per_s", "downloaded_per_delivered", "peak_rss_total_mb")
    return {
        "rtt_s": RTT,
        "samples_read": n,
        "runs": runs,
        "warm": {"runs": warm},
        "summary": {t: {k: summary(rs, k) for k in keys} for t, rs in runs.items()},
        "warm_summary": {t: {k: summary(rs, k) for k in keys} for t, rs in warm.items()},
        "get_limit": limit,
    }


def _get_limit(ctx: Context, endpoint: str, ferry_dir: str) -> dict[str, Any]:
    """Bare ranged GETs of one image's size (``FRAME_SIZE``) at random offsets of ferry's largest shard, 8 in
    flight: the most samples/s a loader that fetches each sample's media with one GET gets through this link."""
    from ferry.shard_tools.dataset import open_dataset

    shards = open_dataset(ferry_dir).manifest.shards
    big = max(range(len(shards)), key=lambda i: int(shards[i].stored_bytes))
    args = {"endpoint": endpoint, "object": f"{BUCKETS['ferry']}/ds/{shards[big].path}", "length": FRAME_SIZE,
            "gets": 100 if ctx.quick else 300, "threads": 8}  # fmt: skip
    res = Runner("limit", "media_get_limit.py", ctx.ferry_python, LOADER_ENV)(ctx, args, timeout=300)
    log(f"media remote limit: {res.get('error') or round(res.get('gets_per_s', 0))} ranged GETs/s")
    return res


def _short(res: dict[str, Any]) -> str:
    keys = ("first_batch_s", "samples_per_s", "downloaded_per_delivered", "peak_rss_total_mb")
    return ", ".join(f"{k}={res[k]:.3g}" for k in keys if isinstance(res.get(k), (int, float)))


def run(ctx: Context) -> dict[str, Any]:
    corpus = _corpus(ctx)
    log(f"media: {corpus['samples']} pairs, {corpus['bytes_per_sample'] / 1e3:.1f} kB each")
    tools = _pack(ctx, corpus)
    runners = _runners(ctx, tools)
    result: dict[str, Any] = {
        "samples": corpus["samples"],
        "bytes_per_sample": corpus["bytes_per_sample"],
        "batch_size": BATCH,
        "shard_size": suite_pack.SHARD_SIZE,
        "energon": ENERGON,
        "ferry_batch": [FERRY_BATCH, SEQ_LEN],
        "workers": WORKERS,
        "policy": POLICY,
        "frame_size": FRAME_SIZE,
        "local": _local(ctx, tools, runners),
    }
    result["remote"] = _remote(ctx, tools, runners, corpus["bytes_per_sample"])
    return result


# ---------------------------------------------------------------- the page (bench/report.py calls these)

LABELS = {
    "ferry": "ferry",
    "mosaic": "MosaicML streaming (MDS, jpeg)",
    "litdata": "litdata",
    "energon": "Megatron-Energon (WebDataset)",
}
PEERS = ("mosaic", "litdata", "energon")
# measure: (where, key, higher is better, digits)
MEASURES = {
    "samples/s, 2 workers, warm": ("local", "samples_per_s", True, 0),
    "samples per CPU second": ("local", "samples_per_cpu_s", True, 0),
    "first batch s, cold cache": ("cold", "first_batch_s", False, 2),
    "peak RSS MiB, runner + workers": ("local", "peak_rss_total_mb", False, 0),
    "S3 at 30 ms: first batch s": ("remote", "first_batch_s", False, 2),
    "S3 at 30 ms: samples/s": ("remote", "samples_per_s", True, 0),
    "S3 at 30 ms: downloaded ÷ delivered bytes": ("remote", "downloaded_per_delivered", False, 2),
    "S3 at 30 ms, 2nd pass, warm cache: first batch s": ("remote_warm", "first_batch_s", False, 2),
    "S3 at 30 ms, 2nd pass, warm cache: samples/s": ("remote_warm", "samples_per_s", True, 0),
    "S3 at 30 ms, 2nd pass, warm cache: bytes downloaded": ("remote_warm", "downloaded_bytes", False, 0),
}


def _runs_of(res: dict[str, Any], where: str, tool: str) -> list[dict[str, Any]]:
    if where == "cold":
        one = res.get("local", {}).get("cold", {}).get(tool)
        return [one] if one else []
    block = res.get("remote", {}).get("warm", {}) if where == "remote_warm" else res.get(where, {})
    return list(block.get("runs", {}).get(tool, []))


def _median(res: dict[str, Any], where: str, key: str, tool: str) -> float | None:
    s = summary(_runs_of(res, where, tool), key)
    return None if s is None else s["median"]


def _conditions(res: dict[str, Any]) -> list[str]:
    """The machine's 1-minute load average over the runs (each run records it as it ends): this 2-core machine
    may have run other work beside them. Results from before runs recorded it carry ``load_1m_observed``
    ``[low, high]``, read with ``uptime`` during the run."""
    loads = [
        r["load_1m"]
        for where in ("cold", "local", "remote", "remote_warm")
        for t in LABELS
        for r in _runs_of(res, where, t)
        if isinstance(r.get("load_1m"), (int, float))
    ]
    span = (min(loads), max(loads)) if loads else tuple(res.get("load_1m_observed") or ())
    if len(span) != 2:
        return []
    return [
        f"1-minute load average during these runs: {span[0]:.1f}–{span[1]:.1f} (the cores: Machine and versions); a "
        "run shares them with whatever else ran, so compare tools by the medians of alternated runs, not by one run.",
        "",
    ]


def section(res: dict[str, Any] | None) -> list[str]:
    """The Multimodal section of docs/BENCHMARKS.md."""
    if not res:
        return []
    lines = ["## Multimodal: image–text pairs decoded (ferry vs MosaicML MDS vs litdata vs Megatron-Energon)", ""]
    if "error" in res:
        return [*lines, str(res["error"]), ""]
    tools = [t for t in LABELS if any(_runs_of(res, w, t) for w in ("local", "remote", "cold"))]
    remote = res.get("remote", {})
    lines += [
        f"{res.get('samples')} JPEG–caption pairs of {res.get('bytes_per_sample', 0) / 1e3:.1f} kB on average, "
        f"shards of {res.get('shard_size', 0) >> 20} MiB for every tool. Same settings for every tool: "
        f"{res.get('workers')} DataLoader workers, `OMP_NUM_THREADS=1`, each JPEG decoded in the workers by the same "
        "Pillow call (`Image.open(...).convert('RGB')` to a numpy array), the same shuffle seed. Batches differ in "
        f"kind: the peers' hold {res.get('batch_size')} pairs; ferry's {res.get('ferry_batch', [0, 0])[0]} packed "
        f"sequences of {res.get('ferry_batch', [0, 0])[1]} tokens (policy `{res.get('policy')}`, frames of "
        f"{res.get('frame_size', 0) >> 10} KiB), about as many pairs; samples/s counts pairs either way. "
        f"Remote: moto through the netem proxy at {remote.get('rtt_s', 0) * 1e3:.0f} ms RTT; every tool keeps "
        "whole shards in a node-local cache (MosaicML and litdata by design, Energon through multi-storage-client's "
        "cache of 64 MiB lines, ferry with `MediaDataset(cache_dir=...)`, which reads by frames until a shard is "
        f"in it). A remote pass reads the first {remote.get('samples_read')} "
        "pairs of the shuffle from an empty cache; the second pass, a new process, reads the same pairs with "
        "the cache the first left. Median of the repeats; the best value of each row in bold.",
        "",
    ]
    if res.get("energon"):
        lines += [f"Megatron-Energon: {res['energon']}", ""]
    lines += _conditions(res)
    lines += [
        "| measure | " + " | ".join(LABELS[t] for t in tools) + " |",
        "|---|" + "---|" * len(tools),
    ]
    for name, (where, key, higher, digits) in MEASURES.items():
        values = {t: _median(res, where, key, t) for t in tools}
        known = [v for v in values.values() if v is not None]
        best = (max(known) if higher else min(known)) if known else None
        cells = []
        for t in tools:
            v = values[t]
            text = "—" if v is None else f"{v:.{digits}f}"
            cells.append(f"**{text}**" if v is not None and v == best else text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    limit = res.get("remote", {}).get("get_limit") or {}
    if limit.get("gets_per_s"):
        lines += [
            "",
            f"Limit of this link for a loader that fetches each sample's media with its own ranged GET: "
            f"{limit['gets_per_s']:.0f} bare {res.get('frame_size', 0) >> 10} KiB ranged GETs/s "
            f"({limit.get('threads')} in flight) through the same proxy and moto server. Until a shard is in its "
            "cache, ferry reads each sample's media by its frames (about one GET a sample), bounded by that rate; "
            "the peers wait for whole shards (few GETs) and read them locally.",
        ]
    return [*lines, ""]


def headline_rows(res: dict[str, Any] | None) -> list[str]:
    """ferry against the better peer on each measure (ratio > 1: ferry ahead)."""
    rows: list[str] = []
    if not res or "error" in res:
        return rows
    for name, (where, key, higher, _digits) in MEASURES.items():
        ferry = _median(res, where, key, "ferry")
        peers = {t: _median(res, where, key, t) for t in PEERS}
        peers = {t: v for t, v in peers.items() if v}
        if not ferry or not peers:
            continue
        best = max(peers, key=lambda t: peers[t]) if higher else min(peers, key=lambda t: peers[t])
        ratio = ferry / peers[best] if higher else peers[best] / ferry
        rows.append(f"| multimodal {name} | {LABELS[best]} | {ratio:.2f}x |")
    return rows
