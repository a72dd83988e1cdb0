"""Schedule: loader throughput of a scheduled mixture against a plain one, and resume cost vs phases.

Eight small packed sources. Throughput: a 3-phase schedule (phase boundaries inside the timed
batches) against a single-phase mixture of the same sources, alternated, median of the repeats;
the target is a ratio of at least 0.95. Resume: set-up + ``load_state_dict`` + first batch for a
state deep in the last phase, for 1 … 1000 phases and near vs far positions (it must grow with
the number of phases at most, never with the position).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import Context, Runner, alternate, log, summary

__all__ = ["run"]

SOURCES = 8
BATCH = 16


def _sources(root: Path, tokens: int) -> list[str]:
    import numpy as np

    from ferry.shard_tools import PackOptions, pack_documents

    urls = []
    for i in range(SOURCES):
        out = root / f"src{i}"
        if not (out / "manifest.json").exists():
            rng = np.random.default_rng(100 + i)
            docs, left = [], tokens
            while left > 0:
                n = int(min(left, rng.integers(200, 4000)))
                docs.append(rng.integers(0, 50000, n, dtype=np.int64))
                left -= n + 1
            opts = PackOptions(vocab_size=50257, eos_id=50256, progress=False, shard_size=4 * 2**20)
            pack_documents(docs, str(out), opts)
        urls.append(str(out))
    return urls


def run(ctx: Context) -> dict[str, Any]:
    root = ctx.data / "schedule"
    root.mkdir(parents=True, exist_ok=True)
    tokens = 150_000 if ctx.quick else 2_000_000
    seq_len = 512 if ctx.quick else 2048
    batches = 200 if ctx.quick else 2000  # several epochs of the mixture: long enough to time
    urls = _sources(root, tokens)
    runner = Runner("ferry", "ferry_schedule.py", ctx.ferry_python)
    base = {"data": urls, "cache_dir": str(ctx.data / "cache" / "schedule"), "seq_len": seq_len, "batch_size": BATCH}

    def one(tool: str, _r: int) -> dict[str, Any]:
        phases = 3 if tool == "3-phase" else 1
        return runner(ctx, {**base, "mode": "throughput", "phases": phases, "batches": batches}, timeout=600)

    runs = alternate(ctx, ["single-phase", "3-phase"], one, what="schedule throughput")
    med = {t: (summary(r, "samples_per_s") or {}).get("median") for t, r in runs.items()}
    cpu = {t: (summary(r, "samples_per_cpu_s") or {}).get("median") for t, r in runs.items()}
    ratio = med["3-phase"] / med["single-phase"] if med["3-phase"] and med["single-phase"] else None
    ratio_cpu = cpu["3-phase"] / cpu["single-phase"] if cpu["3-phase"] and cpu["single-phase"] else None
    log(f"schedule: 3-phase / single-phase throughput = {ratio} (wall), {ratio_cpu} (per CPU second)")
    resume = []
    for phases in [1, 10, 100] if ctx.quick else [1, 10, 100, 1000]:
        for position in (10**6, 10**15):
            res = runner(ctx, {**base, "mode": "resume", "phases": phases, "position": position}, timeout=600)
            resume.append({"phases": phases, "position": position, **res})
            log(f"schedule resume {phases} phases at {position:.0e}: {res}")
    return {
        "throughput": runs,
        "median_samples_per_s": med,
        "median_samples_per_cpu_s": cpu,
        "ratio": ratio,
        "ratio_cpu": ratio_cpu,
        "target": 0.95,
        "resume": resume,
    }
