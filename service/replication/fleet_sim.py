"""A fluid simulation of copies over a fleet of clusters (pure: no I/O, no clock).

Copies are flows of bytes from one cluster to another. A flow starts once its sender holds what it sends
(``after``: the flows it waits for) and once the flow before it on the same link is done (``queue``: one
group at a time per link, in plan order, as a relay forwards what it verified). Running flows share every
link, every sender's egress and every receiver's ingress max-min fairly (progressive filling), and a flow
pays the link's round-trip time once before its bytes move. Time advances from one flow's end to the next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config_types import LinkSpec
from .routes import NodeCaps

__all__ = ["Flow", "simulate_flows"]


@dataclass
class Flow:
    """``size`` bytes from ``src`` to ``dst``, started when every flow in ``after`` is done (indices)."""

    src: str
    dst: str
    size: float
    after: Sequence[int] = ()
    start: float = math.nan  # when its bytes started to move (after the rtt)
    end: float = math.nan
    left: float = field(default=0.0, repr=False)


def _rates(active: Sequence[int], flows: Sequence[Flow], cap: Mapping[tuple[str, ...], float]) -> dict[int, float]:
    """Max-min fair rates by progressive filling over the link, egress and ingress each flow crosses."""
    uses: dict[int, tuple[tuple[str, ...], ...]] = {
        i: (("l", flows[i].src, flows[i].dst), ("e", flows[i].src), ("i", flows[i].dst)) for i in active
    }
    left = {r: cap.get(r, math.inf) for i in active for r in uses[i]}
    rate: dict[int, float] = {}
    free = set(active)
    while free:
        count: dict[tuple[str, ...], int] = {}
        for i in free:
            for r in uses[i]:
                count[r] = count.get(r, 0) + 1
        res, share = min(((r, left[r] / n) for r, n in count.items()), key=lambda t: t[1])
        if math.isinf(share):
            for i in free:
                rate[i] = math.inf
            break
        for i in [i for i in free if res in uses[i]]:
            rate[i] = share
            free.discard(i)
            for r in uses[i]:
                left[r] -= share
    return rate


def simulate_flows(
    flows: Sequence[Flow], links: Sequence[LinkSpec], caps: Mapping[str, NodeCaps] | None = None
) -> float:
    """Run ``flows`` to their ends (each flow's ``start``/``end`` are set); returns when the last one ends.
    A flow between clusters with no link between them is an error."""
    caps = caps or {}
    cap: dict[tuple[str, ...], float] = {}
    rtt: dict[tuple[str, str], float] = {}
    for ln in links:
        cap[("l", ln.src, ln.dst)] = math.inf if ln.capacity is None else ln.capacity
        rtt[(ln.src, ln.dst)] = ln.rtt
    for n, c in caps.items():
        if c.egress is not None:
            cap[("e", n)] = c.egress
        if c.ingress is not None:
            cap[("i", n)] = c.ingress
    prev_on_link: dict[tuple[str, str], int] = {}
    waits: list[list[int]] = []
    for i, f in enumerate(flows):
        if (f.src, f.dst) not in rtt:
            raise ValueError(f"no link {f.src}->{f.dst}")
        before = prev_on_link.get((f.src, f.dst))
        waits.append([*f.after, *([] if before is None else [before])])
        prev_on_link[(f.src, f.dst)] = i
        f.left, f.start, f.end = float(f.size), math.nan, math.nan
    return _run(flows, waits, cap, rtt)


def _run(
    flows: Sequence[Flow],
    waits: Sequence[Sequence[int]],
    cap: Mapping[tuple[str, ...], float],
    rtt: Mapping[tuple[str, str], float],
) -> float:
    now = 0.0
    done: set[int] = set()
    pending = set(range(len(flows)))
    active: set[int] = set()
    while pending or active:
        for i in [i for i in pending if all(w in done for w in waits[i])]:
            pending.discard(i)
            active.add(i)
            ready = max([now, *(flows[w].end for w in waits[i])])
            flows[i].start = ready + rtt[(flows[i].src, flows[i].dst)]
        moving = [i for i in active if flows[i].start <= now + 1e-12]
        rate = _rates(moving, flows, cap) if moving else {}
        ends = [now + flows[i].left / rate[i] if rate[i] > 0 else math.inf for i in moving]
        starts = [flows[i].start for i in active if flows[i].start > now + 1e-12]
        step = min([*ends, *starts, math.inf])
        if math.isinf(step):
            if any(math.isinf(r) for r in rate.values()):
                step = now
            else:
                raise ValueError("flows wait on each other or on a link with no capacity")
        for i in moving:
            flows[i].left -= rate[i] * (step - now) if not math.isinf(rate[i]) else flows[i].left
            if flows[i].left <= 1e-6 * max(1.0, flows[i].size):
                flows[i].end = step
                active.discard(i)
                done.add(i)
        now = step
    return max((f.end for f in flows), default=0.0)
