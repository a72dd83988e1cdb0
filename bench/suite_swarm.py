"""Swarm fills against today's tree of whole versions: ``bench/swarm_check.py`` (an origin and three clusters,
one daemon per destination, every link capped by ``[limits.per_link]``), with links alike and with the
origin's links at 1, 1/2 and 1/4 of the rate; fill time against the max-flow bound and origin bytes per shard."""

from __future__ import annotations

import argparse
import os
from typing import Any

from harness import Context, log
from swarm_check import _links, fill, lower_bound

from ferry.shard_tools.units import parse_rate

__all__ = ["run", "section"]

SHAPES = {"links alike": (1.0, 1.0, 1.0), "origin links 1, 1/2, 1/4": (1.0, 0.5, 0.25)}


def run(ctx: Context, mib: int = 48, rate: str = "8MiB/s", transfers: int = 4) -> dict[str, Any]:
    bps = parse_rate(rate)
    mib = mib if not ctx.quick else 12
    cases = []
    for shape, shares in SHAPES.items():
        a = argparse.Namespace(mib=mib, shard_kib=512, rate=bps, transfers=transfers,
                               origin_shares=shares)  # fmt: skip
        for i in range(ctx.repeats):
            load = os.getloadavg()[0]
            runs = [fill("tree", a), fill("swarm", a)]
            bound = lower_bound(runs[0]["bytes"], _links(bps, shares))
            cases.append({"shape": shape, "bound_s": bound, "load": load, "runs": runs})
            log(f"swarm {shape} {i + 1}/{ctx.repeats}: bound {bound:.2f} s, "
                + ", ".join(f"{r['mode']} {r['fill_s']:.2f} s" for r in runs))  # fmt: skip
    return {"mib": mib, "rate": bps, "transfers": transfers, "cases": cases}


def section(res: dict[str, Any] | None) -> list[str]:
    """The swarm section of docs/BENCHMARKS.md."""
    if not res:
        return []
    lines = ["## Swarm fills against the tree of whole versions", ""]
    if "error" in res:
        return [*lines, str(res["error"]), ""]
    lines += [
        f"`bench/swarm_check.py`: an origin and three clusters on local disk, one daemon per destination, "
        f"{res['mib']} MiB in 512 KiB shards, every link capped at {res['rate'] / 2**20:g} MiB/s by "
        f"`[limits.per_link]` (the origin's links at a fraction of it where said), {res['transfers']} transfers; "
        "today's tree of whole versions and `[swarm] enabled` in the same run, against the max-flow bound.",
        "",
        "| links | load | bound | tree | origin sends | swarm | origin sends |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res["cases"]:
        tree, swarm = c["runs"]
        cells = [f"{r['fill_s']:.2f} s ({r['fill_s'] / c['bound_s']:.2f}×) | {r['origin_sends_per_shard']:.2f}×"
                 if r["fill_s"] else "did not finish | " for r in (tree, swarm)]  # fmt: skip
        lines.append(f"| {c['shape']} | {c['load']:.1f} | {c['bound_s']:.2f} s | {cells[0]} | {cells[1]} |")
    return [*lines, ""]
