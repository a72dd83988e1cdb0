"""Fleet simulator vs a real mesh: ``bench/fleet_sim_check.py`` (four clusters, three daemons, today's tree
of whole versions, links capped by ``[limits.per_link]``) run ``ctx.repeats`` times; predicted and measured
fill time per run and the relative error."""

from __future__ import annotations

from typing import Any

from fleet_sim_check import measure, predict
from harness import Context, log

from ferry.shard_tools.units import parse_rate

__all__ = ["run", "section"]


def run(ctx: Context, mib: int = 24, rate: str = "3MiB/s", poll: float = 0.3) -> dict[str, Any]:
    bps = parse_rate(rate)
    runs = []
    for i in range(ctx.repeats):
        got = measure(mib if not ctx.quick else max(4, mib // 3), bps, poll)
        want = predict(got["bytes"], bps)
        fill_p, fill_m = max(want.values()), max(got["measured"].values(), default=float("inf"))
        runs.append({"predicted": want, "measured": got["measured"], "fill_predicted_s": fill_p,
                     "fill_measured_s": fill_m, "error": fill_m / fill_p - 1})  # fmt: skip
        log(f"fleet_sim {i + 1}/{ctx.repeats}: predicted {fill_p:.2f} s, measured {fill_m:.2f} s")
    return {"mib": mib, "rate": bps, "poll": poll, "runs": runs, "worst_error": max(abs(r["error"]) for r in runs)}


def section(res: dict[str, Any] | None) -> list[str]:
    """The fleet simulator section of docs/BENCHMARKS.md: its prediction against the real mesh."""
    if not res:
        return []
    lines = ["## Fleet simulator against a real mesh", ""]
    if "error" in res:
        return [*lines, str(res["error"]), ""]
    lines += [
        f"`bench/fleet_sim_check.py`: four clusters on local disk and three daemons (today's tree of whole versions), "
        f"{res['mib']} MiB, every link capped at {res['rate'] / 2**20:g} MiB/s by `[limits.per_link]`, polling every "
        f"{res['poll']:g} s; `python -m ferry.service.replication.simulate` predicts each cluster's fill time from "
        "the same caps.",
        "",
        "| run | predicted fill | measured fill | error |",
        "|---|---|---|---|",
    ]
    for i, r in enumerate(res["runs"], 1):
        lines.append(f"| {i} | {r['fill_predicted_s']:.2f} s | {r['fill_measured_s']:.2f} s | {r['error']:+.1%} |")
    lines += ["", f"Worst error {res['worst_error']:.1%} (goal: within 15%)."]
    return [*lines, ""]
