"""Fleet simulator vs a real mesh: ``bench/fleet_sim_check.py`` (four clusters, three daemons, today's tree
of whole versions, links capped by ``[limits.per_link]``) run ``ctx.repeats`` times; predicted and measured
fill time per run and the relative error."""

from __future__ import annotations

from typing import Any

from fleet_sim_check import measure, predict
from harness import Context, log

from ferry.shard_tools.units import parse_rate

__all__ = ["run"]


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
