"""Pack: tokens/s and output bytes, ferry vs litdata vs MosaicML vs the zstd-only limit, equal settings.

Every tool reads the same Parquet files, appends EOS per document, writes ~64 MiB (raw) shards
compressed with zstd at the same level and uses the same number of worker processes.
tokens/s counts the corpus' document tokens (EOS not counted) over the runner's own wall time.
"""

from __future__ import annotations

from typing import Any

from harness import Context, Runner, alternate, log, ratios

__all__ = ["run"]

SHARD_SIZE = 64 * 2**20


def _runners(ctx: Context) -> dict[str, Runner]:
    tools = {"ferry": Runner("ferry", "ferry_pack.py", ctx.ferry_python)}
    if ctx.peers_python:
        tools["litdata"] = Runner("litdata", "litdata_pack.py", ctx.peers_python)
        tools["mosaic"] = Runner("mosaic", "mosaic_pack.py", ctx.peers_python)
    tools["zstd-limit"] = Runner("zstd-limit", "zstd_limit.py", ctx.ferry_python)
    return tools


def out_dir(ctx: Context, tool: str, level: int, workers: int) -> str:
    """Where a tool's pack output for one case lives (the load suite reads the level-1, 1-worker ones)."""
    return str(ctx.data / "out" / f"pack-{tool}-L{level}-W{workers}")


def run(ctx: Context) -> dict[str, Any]:
    corpus = ctx.corpus
    runners = _runners(ctx)
    levels = [1] if ctx.quick else [1, 3]
    workers_list = [1] if ctx.quick else [1, 2]
    cases: list[dict[str, Any]] = []
    for level in levels:
        for workers in workers_list:

            def one(tool: str, _r: int, level: int = level, workers: int = workers) -> dict[str, Any]:
                args = {
                    "inputs": corpus.files,
                    "out": out_dir(ctx, tool, level, workers),
                    "level": level,
                    "workers": workers,
                    "shard_size": SHARD_SIZE,
                    "vocab_size": corpus.spec.vocab_size,
                    "eos_id": corpus.spec.eos_id,
                    "seq_len": 2048,
                }
                res = runners[tool](ctx, args)
                if "seconds" in res:
                    res["tokens_per_s"] = corpus.tokens / res["seconds"]
                return res

            runs = alternate(ctx, list(runners), one, what=f"pack zstd-{level} x{workers}")
            cases.append({"level": level, "workers": workers, "runs": runs, **ratios(runs, "zstd-limit")})
    result: dict[str, Any] = {"tokens": corpus.tokens, "shard_size": SHARD_SIZE, "cases": cases}
    result["profile"] = _maybe_profile(ctx, runners["ferry"], cases)
    return result


def _maybe_profile(ctx: Context, ferry: Runner, cases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """cProfile of ferry's pack (1 worker, level 1) when it misses a target (3x faster peer, 50% of limit)."""
    behind = [c for c in cases if c.get("ratio_vs_faster_peer", 99) < 3.0 or c.get("fraction_of_limit", 1.0) < 0.5]
    if not behind or not ctx.profile:
        return None
    log("pack: ferry misses a target; profiling ferry pack (1 worker, zstd-1)")
    corpus = ctx.corpus
    text = ferry.profile(
        ctx,
        {
            "inputs": corpus.files,
            "out": str(ctx.data / "out" / "pack-ferry-profile"),
            "level": 1,
            "workers": 1,
            "shard_size": SHARD_SIZE,
            "vocab_size": corpus.spec.vocab_size,
            "eos_id": corpus.spec.eos_id,
        },
    )
    return {"case": "zstd-1, 1 worker", "text": text}
