"""Scale: what a dataset of up to 1M shards costs. Each part runs a script of ``bench/`` in a child process and
keeps its JSON: the manifest and a rank's start-up per size
(``scale_manifest.py --loader``); a real ``ferry serve`` planning a first fill and a new version of the
largest size, and the steps of that planning (``--daemon``, ``--new-version``, ``--engine-steps``); N ranks of one
node reading the manifest from S3 behind a slow link (``startup_ranks.py``); ferry's own HTTP pieces against the
libraries (``http_clients.py``)."""

from __future__ import annotations

import os
from typing import Any

from harness import HERE, Context, log, run_json

from ferry.shard_tools.units import format_bytes

__all__ = ["run", "section"]


def _script(ctx: Context, name: str, args: list[Any], timeout: float) -> dict[str, Any]:
    """Run ``bench/<name>`` with ``args``; its JSON, or ``{"error": ...}``."""
    out = run_json([ctx.ferry_python, str(HERE / name), *map(str, args)], ctx.env(), timeout)
    if "error" in out:
        out["error"] = f"{name}: {out['error']}"
    else:
        log(f"scale: {name} {' '.join(map(str, args[:3]))} … in {out['wall_s']:.0f} s")
    return out


def run(ctx: Context, largest: int | None = None) -> dict[str, Any]:
    sizes = [1_000, 10_000] if ctx.quick else [1_000, 10_000, 100_000, 1_000_000]
    n = largest or sizes[-1]
    sizes = [s for s in sizes if s < n] + [n]
    keep = ctx.data / f"scale-version-{n}"  # the new-version fixture, built once and reused
    out: dict[str, Any] = {"sizes": sizes, "largest": n}
    out["manifest"] = _script(ctx, "scale_manifest.py", ["--sizes", *sizes, "--repeat", ctx.repeats, "--loader"], 1800)
    out["daemon"] = _script(ctx, "scale_manifest.py", ["--daemon", "--sizes", n], 1800)
    out["engine_steps"] = _script(ctx, "scale_manifest.py", ["--engine-steps", "--sizes", n, "--keep", keep], 1800)
    out["new_version"] = [
        _script(ctx, "scale_manifest.py", ["--new-version", "--sizes", n, "--keep", keep], 900)
        for _ in range(ctx.repeats)
    ]
    ranks = [1, 4] if ctx.quick else [1, 4, 16]
    out["ranks"] = _script(ctx, "startup_ranks.py", ["--shards", n, "--ranks", *ranks], 1800)
    out["http"] = _script(
        ctx, "http_clients.py", ["--requests", 200, "--sizes", "65536,8388608", "--rounds", ctx.repeats], 900
    )
    out["load_average"] = os.getloadavg()[0]
    return out


# ---------------------------------------------------------------- the page


def _mib(x: float) -> str:
    return format_bytes(x * 2**20)


def _s(x: float) -> str:
    """Seconds in the unit that shows them."""
    return f"{x:.2f} s" if x >= 0.1 else f"{x * 1e3:.1f} ms" if x >= 1e-3 else f"{x * 1e6:.0f} µs"


def _error(part: dict[str, Any] | None) -> str | None:
    if not part:
        return "not run"
    return str(part["error"]) if "error" in part else None


def _manifest(part: dict[str, Any]) -> list[str]:
    lines = [
        "### The manifest and a rank's start-up, per size",
        "",
        "`bench/scale_manifest.py --loader`: a synthetic manifest per size (realistic columns: "
        "`shards/<32 hex>.arrow.zst` paths, two `xxh128:` digests, 128 MiB raw per shard; no shard bytes), "
        "each size in a fresh process. *load* is `load_manifest` (header, table, digest check, validation); "
        "*peak RSS added* is the process's peak RSS after the loads less before them (one manifest held at a "
        "time); *rank start-up* is `TokenDataset` + `TokenLoader` for rank 3 of 8 and "
        "locating its first batch's shards, `global` shuffle; medians of the repeats.",
        "",
        "| shards | shard table | load | peak RSS added | locate 100k samples | rank start-up | resume at 90% |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in part.get("results", []):
        if "error" in r:
            lines.append(f"| {r['shards']:,} | {r['error']} ||||||")
            continue
        ld = r.get("loader", {}).get("global", {})
        lines.append(
            f"| {r['shards']:,} | {format_bytes(r['shard_table_bytes'])} | {r['load_manifest_s']:.3f} s "
            f"| {_mib(r['peak_rss_after_load_mib'] - r['peak_rss_before_load_mib'])} "
            f"| {_s(r['locate_100k_samples_s'])} "
            f"| {ld.get('start_up_s', float('nan')):.3f} s | {ld.get('resume_at_90pct_s', float('nan')):.3f} s |"
        )
    return [*lines, ""]


def _daemon(res: dict[str, Any]) -> list[str]:
    n = res["largest"]
    lines = [
        "### A daemon planning the largest dataset",
        "",
        f"{n:,} shards. A real `ferry serve` replicating east → west (local directories, the shards sparse files "
        "of the right size; a 1 B/s bandwidth limit keeps the first copies waiting, so the daemon holds a planned "
        "pass). Timed "
        "from the process's start (imports and the API included) until the API shows west syncing (or complete); "
        "`VmRSS` two seconds later and `VmHWM`, the peak so far.",
        "",
        "| case | start → planned | RSS held | peak RSS |",
        "|---|---:|---:|---:|",
    ]
    d = res.get("daemon") or {}
    for r in d.get("daemon", []):
        lines.append(
            f"| first fill: west empty, every shard to copy | {r['start_to_planned_s']:.1f} s "
            f"| {_mib(r['planned_pass_rss']['VmRSS'])} | {_mib(r['planned_pass_rss']['VmHWM'])} |"
        )
        lines.append(
            f"| steady: west already publishes the version | {r['start_to_complete_s']:.1f} s (to complete) "
            f"| {_mib(r['steady_rss']['VmRSS'])} | {_mib(r['steady_rss']['VmHWM'])} |"
        )
    if _error(d):
        lines.append(f"| daemon | {_error(d)} | | |")
    for i, part in enumerate(res.get("new_version") or [], 1):
        if _error(part):
            lines.append(f"| new version, run {i} | {_error(part)} | | |")
            continue
        for r in part["new_version"]:
            rss = r["planned_pass_rss"]
            lines.append(
                f"| new version adding {r['new_shards']:,} shards (west holds and has verified the one before), "
                f"run {i}, load {r['load_average']:.1f} | {r['start_to_planned_s']:.2f} s | {_mib(rss['VmRSS'])} "
                f"| {_mib(rss['VmHWM'])} |"
            )
    versions = [r for part in res.get("new_version") or [] if not _error(part) for r in part["new_version"]]
    if versions:
        met = sum(all(r["within_targets"].values()) for r in versions)
        lines += ["", f"Goal for a new version: planned within 2 s of the start and within 300 MiB, held and at the "
                  f"peak: met in {met} of {len(versions)} runs."]  # fmt: skip
    steps = res.get("engine_steps") or {}
    if _error(steps):
        return [*lines, "", f"Planning steps: {_error(steps)}", ""]
    for r in steps.get("engine_steps", []):
        lines += [
            "",
            f"The steps of planning that new version, timed one by one in one process "
            f"(`bench/scale_manifest.py --engine-steps`, load {r['load_average']:.1f}; what west holds found by "
            + ("listing it" if r["held_by"] == "listing" else "looking up the new shards and a sample of the others")
            + "):",
            "",
            "| load the version | its columns | verified set read | verified rows | look up new + sampled "
            "| plan | the pass's rows | planned in all | Arrow memory held | peak RSS |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {_s(r['load_version_s'])} | {_s(r['columns_s'])} | {_s(r['verified_set_s'])} "
            f"| {_s(r['verified_mask_s'])} | {_s(r['held_s'])} | {_s(r['plan_s'])} "
            f"| {_s(r['work_s'])} | **{_s(r['planned_total_s'])}** | {_mib(r['arrow_mib_held'])} "
            f"| {_mib(r['peak_rss_mib'])} |",
        ]
    return [*lines, ""]


def _ranks(part: dict[str, Any]) -> list[str]:
    lines = [
        "### Job start-up on one node",
        "",
        f"`bench/startup_ranks.py`: N ranks of one node read a {part['shards']:,}-shard manifest from S3. The "
        f"manifest ({format_bytes(part['table_bytes'])} of shard table) on a moto S3 "
        f"server behind `bench/netem.py` ({part['rtt_s'] * 1e3:.0f} ms per request, {part['rate_mb_s']:.0f} MB/s), "
        "which counts every byte it serves. N rank processes start, wait until all are ready, then read the "
        "manifest at once: without a node cache, with an empty one (a job's first start on the node) and with the "
        f"table already in it (a restart). {part['cpus']} cores; load {part['load_before'][0]:.1f} before, "
        f"{part['load_after'][0]:.1f} after.",
        "",
        "| ranks | node cache | read from storage | table reads | start-up, median / slowest | CPU per rank |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in part["rows"]:
        lines.append(
            f"| {r['ranks']} | {r['mode']} | {format_bytes(r['storage_bytes'])} | {r['table_requests']} "
            f"| {r['startup_median_s']:.1f} s / {r['startup_max_s']:.1f} s | {r['cpu_median_s']:.2f} s |"
        )
    return [*lines, ""]


def _http(part: dict[str, Any]) -> list[str]:
    lines = [
        "### ferry's own HTTP pieces against the libraries",
        "",
        "`bench/http_clients.py`: PUTs of random bodies to a local HTTP server that reads and discards each body, "
        "from `ferry.service.transfer.http_pool` and from an `httpx.Client` (medians of alternating rounds; client "
        "CPU is the client process's). The reason ferry keeps its own pool beside httpx.",
        "",
        "| body | client | MiB/s | client CPU per PUT | client CPU per GiB |",
        "|---|---|---:|---:|---:|",
    ]
    for size, r in part["puts"].items():
        for who, label in (("http_pool", "`http_pool`"), ("httpx", "`httpx.Client`")):
            m = r[who]
            lines.append(
                f"| {int(size) // 1024:,} KiB ({r['requests']} PUTs) | {label} | {m['mib_s']:.0f} "
                f"| {m['cpu_us_per_request']:.0f} µs | {m['cpu_s_per_gib']:.2f} s |"
            )
    s = part["signing"]
    lines += [
        "",
        "Signing one S3 GET (SigV4), and importing what signing needs in a fresh interpreter (less an empty one): "
        "the reason `ferry.shard_tools.storage.s3_get` keeps its own signer for the loader's first manifest read "
        "and the daemon's no-op check.",
        "",
        "| | `s3_get` | botocore |",
        "|---|---:|---:|",
        f"| one signature | {s['sign_us']['s3_get']:.0f} µs | {s['sign_us']['botocore']:.0f} µs |",
        f"| import | {s['import_ms']['s3_get']:.0f} ms | {s['import_ms']['botocore_signer']:.0f} ms (the signer); "
        f"{s['import_ms']['botocore_session_client']:.0f} ms (a session and an S3 client) |",
    ]
    return [*lines, ""]


def section(res: dict[str, Any] | None) -> list[str]:
    """The scale section of docs/BENCHMARKS.md."""
    if not res:
        return []
    lines = ["## Scale: up to 1M shards", ""]
    if "error" in res:
        return [*lines, str(res["error"]), ""]
    lines += [
        "What a large dataset costs the manifest, the daemon and a node's ranks; "
        "[ferry at scale](SCALE.md) puts these numbers to work.",
        "",
    ]
    for part, render in (("manifest", _manifest), ("ranks", _ranks), ("http", _http)):
        if part == "ranks":
            lines += _daemon(res)
        err = _error(res.get(part))
        lines += [f"{part}: {err}", ""] if err else render(res[part])
    return lines
