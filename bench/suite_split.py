"""Split: one large input file packed with ``--workers 1`` and ``2`` — ferry cuts it into sub-units.

Two inputs: ~1 GiB of JSON Lines text with a byte-level BPE tokenizer, and one Parquet file of
token ids (440M tokens). The JSON Lines cases pin the tokenizer to one thread
(``RAYON_NUM_THREADS=1``: the ``tokenizers`` library otherwise runs ``encode_batch`` on every
core itself), so the ratio measures ferry's workers; one more case shows one worker with the
tokenizer's own threads. Each case also counts the extra (partial) shards the cuts make: the
shards the same documents would give as one unit, from the cutter's rule.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from typing import Any

from harness import RUNNERS, Context, alternate, log, run_json, summary
from split_corpus import SplitSpec, ensure_split_inputs

__all__ = ["run"]

SHARD_SIZE = 16 * 2**20  # sub-units of 256 MiB of JSON Lines (4 of them) and 128 MiB raw of Parquet
QUICK = SplitSpec(jsonl_bytes=24 * 2**20, parquet_tokens=24_000_000)
QUICK_SHARD_SIZE = 256 * 2**10
QUICK_MIN_SPLIT = 2**20  # --quick: cut the small files too


def _case(ctx: Context, name: str, args: dict[str, Any], threads: str | None) -> Any:
    def one(tool: str, _r: int) -> dict[str, Any]:
        workers = int(tool[1:])
        env = ctx.env()
        env["PYTHONPATH"] += os.pathsep + str(ctx.repo)  # the checkout's ferry, also beside another install
        if threads is not None:
            env["RAYON_NUM_THREADS"] = threads
        cmd = [ctx.ferry_python, str(RUNNERS / "ferry_pack_split.py")]
        out = str(ctx.data / "out" / f"split-{name}-{tool}")
        extra = {"count_unsplit": tool == "w1" and _r == 0, "workers": workers, "out": out}
        return run_json([*cmd, json.dumps({**args, **extra})], env, timeout=1800)

    return one


def _ratio(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    med = {t: (summary(r, "seconds") or {}).get("median") for t, r in runs.items()}
    out: dict[str, Any] = {"seconds": med}
    if med.get("w1") and med.get("w2"):
        out["ratio_w2_vs_w1"] = med["w1"] / med["w2"]
    first = next((r for r in runs.get("w1", []) if "shards_without_split" in r), None)
    if first:
        out["units"] = first["units"]
        out["shards"] = first["shards"]
        out["shards_without_split"] = first["shards_without_split"]
        out["extra_shards"] = first["shards"] - first["shards_without_split"]
    ids = {r.get("version_id") for rs in runs.values() for r in rs if "version_id" in r}
    out["identical_versions"] = len(ids) == 1
    return out


def _burn(n: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t0


def cpu_ceiling(n: int = 10_000_000) -> dict[str, float]:
    """What two processes gain over one on a pure CPU loop right now: the most any 2-worker
    ratio can reach on this machine (less than 2 where other work shares the cores)."""
    t0 = time.perf_counter()
    _burn(n)
    _burn(n)
    serial = time.perf_counter() - t0
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(_burn, [1000, 1000])  # start-up off the clock
        t0 = time.perf_counter()
        pool.map(_burn, [n, n])
        parallel = time.perf_counter() - t0
    return {"ratio": serial / parallel, "loadavg_1m": os.getloadavg()[0]}


def run(ctx: Context) -> dict[str, Any]:
    spec = QUICK if ctx.quick else SplitSpec()
    inputs = ensure_split_inputs(ctx.data, spec)
    shard_size = QUICK_SHARD_SIZE if ctx.quick else SHARD_SIZE
    common: dict[str, Any] = {"level": 1, "shard_size": shard_size}
    if ctx.quick:
        common["min_split"] = QUICK_MIN_SPLIT
    jsonl = {**common, "inputs": [inputs.jsonl], "tokenizer": inputs.tokenizer}
    parquet = {**common, "inputs": [inputs.parquet], "vocab_size": 50257, "eos_id": 50256}
    result: dict[str, Any] = {"shard_size": shard_size, "spec": spec.__dict__, "cases": {}}
    plan = [
        ("jsonl", jsonl, "1", ["w1", "w2"]),
        ("jsonl-tokenizer-threads", jsonl, None, ["w1"]),
        ("parquet", parquet, None, ["w1", "w2"]),
    ]
    for name, args, threads, tools in plan:
        ceiling = cpu_ceiling()
        runs = alternate(ctx, tools, _case(ctx, name, args, threads), what=f"split {name}")
        case = {"runs": runs, **_ratio(runs), "cpu_ceiling_before": ceiling, "cpu_ceiling_after": cpu_ceiling()}
        result["cases"][name] = case
        if "ratio_w2_vs_w1" in case:
            log(
                f"split {name}: --workers 2 is {case['ratio_w2_vs_w1']:.2f}x --workers 1 "
                f"({case.get('units')} units, {case.get('shards')} shards, "
                f"{case.get('extra_shards')} more than unsplit; two processes on a CPU loop: "
                f"{ceiling['ratio']:.2f}x before, {case['cpu_ceiling_after']['ratio']:.2f}x after)"
            )
    threaded = result["cases"]["jsonl-tokenizer-threads"]["seconds"].get("w1")
    single = result["cases"]["jsonl"]["seconds"]
    if threaded and single.get("w2"):
        result["jsonl_w2_vs_w1_tokenizer_threads"] = threaded / single["w2"]
    return result
