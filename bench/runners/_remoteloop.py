"""The training loop of the remote runners: the same clock, step and stall accounting for every tool.

``build(a)`` makes the loader (its construction counts in the time to the first batch); ``ids(batch)``
touches the batch. After each batch the loop sleeps ``step_s`` (the simulated training step); the time
spent in ``next()`` after the first batch is the stall, also reported for the second half of the run alone
(``late_stall_share``: past the cold start); ``cpu_s`` is the CPU time of the loader's processes (DataLoader
workers included) after the first batch. Runs until ``max_batches`` or ``max_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _common import args, cpu_seconds, emit, now, peak_rss_mb

__all__ = ["main"]


def main(
    build: Callable[[dict[str, Any]], Any], ids: Callable[[Any], Any], extra: Callable[[Any], dict] | None = None
) -> None:
    a = args()
    t0 = now()
    loader = build(a)
    it = iter(loader)
    ids(next(it))
    first = now() - t0
    stall = late_stall = 0.0
    n = 0
    t1, cpu1 = now(), cpu_seconds()
    step = float(a.get("step_s", 0.02))
    seconds = float(a.get("max_seconds", 10.0))
    late = None  # when the second half of the run began (the cold start's window is in by then)
    for _ in range(int(a.get("max_batches", 10**6))):
        if now() - t1 >= seconds:
            break
        if late is None and now() - t1 >= seconds / 2:
            late = now()
        if step:
            time.sleep(step)
        w = now()
        try:
            batch = next(it)
        except StopIteration:
            break
        stall += now() - w
        if late is not None:
            late_stall += now() - w
        ids(batch)
        n += 1
    wall, cpu = now() - t1, cpu_seconds() - cpu1
    late_wall = now() - late if late is not None else 0.0
    tokens = n * a["batch_size"] * a["seq_len"]
    out = {
        "first_batch_s": first,
        "batches": n,
        "seconds": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        # the loader's processes (workers included) after the first batch: what the rate cost the machine
        "cpu_s": cpu,
        # from construction on, first batch included: what a job starting cold sees over the run
        "overall_tokens_per_s": (tokens + a["batch_size"] * a["seq_len"]) / (first + wall),
        "stall_s": stall,
        "stall_share": stall / wall if wall > 0 else 0.0,
        # the second half alone: past the cold start, while the link carries far more than the loop consumes
        "late_stall_share": late_stall / late_wall if late_wall > 0 else None,
        **peak_rss_mb(),
    }
    if extra is not None:
        out.update(extra(loader))
    del it
    emit(out)
