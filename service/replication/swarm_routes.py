"""Which source a routed swarm fill (``[swarm] routed``) pulls each row from (pure: sizes and links in, a
mask per source out; no I/O).

The rows a filler needs are dealt to :data:`GROUPS` shard groups (row ``r`` to group ``r % GROUPS``), held
by the rule's source and every cluster that already publishes the version. The route planner
(:func:`~.routes.plan_routes`) picks, per group and per filler, the cluster to copy it from: the source,
a holder, or another filler relaying it. Every filler computes the same plan from the same facts (the
sorted fillers, the holders, the ``[[links]]``, the sizes of the rows to copy), so a filler that waits on a
relay for a group is waited on by nobody for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..config_types import LinkSpec
from .routes import RoutePlan, ShardGroup, plan_routes

__all__ = ["GROUPS", "RoutedRows", "route_rows", "planned_rates"]

#: shard groups a version's rows are planned in: enough to split the rows over a few trees in fine steps,
#: few enough that a plan takes milliseconds
GROUPS = 64


@dataclass(frozen=True)
class RoutedRows:
    """The plan, and for one filler the rows it pulls from each source (a bool per row of the version)."""

    plan: RoutePlan
    sources: dict[str, np.ndarray]

    def source_of(self, row: int) -> str | None:
        """The cluster the plan has ``row`` copied from (None: a row not planned)."""
        return next((s for s, mask in self.sources.items() if mask[row]), None)


def route_rows(
    sizes: np.ndarray,
    rows: np.ndarray,
    holders: Sequence[str],
    fillers: Sequence[str],
    me: str,
    links: Iterable[LinkSpec],
    budget: float | None = None,
) -> RoutedRows:
    """Route ``rows`` (of a version whose shards weigh ``sizes`` bytes) to ``me``, one of ``fillers``.

    Only the ``links`` between the clusters in play count; a link into a holder is never used. Raises
    :class:`~.routes.RouteError` when a filler cannot be reached over the declared links or no plan fits
    ``budget`` ($ of egress for the whole fleet's copies of ``rows``).
    """
    shards = len(sizes)
    rows = np.asarray(rows, dtype=np.int64)
    n = min(GROUPS, max(1, len(rows)))
    group_of = rows % n
    weight = np.bincount(group_of, weights=np.asarray(sizes, dtype=np.float64)[rows], minlength=n)
    held = frozenset(holders)
    groups = [ShardGroup(f"g{i}", int(weight[i]), held) for i in range(n)]
    play = held | set(fillers)
    specs = [ln for ln in links if ln.src in play and ln.dst in play and ln.dst not in held]
    dests = [f for f in fillers if f not in held]
    plan = plan_routes(groups, dests, specs, budget=budget)
    sources: dict[str, np.ndarray] = {}
    for i in range(n):
        src = plan.source_of(f"g{i}", me)
        mask = sources.setdefault(src, np.zeros(shards, dtype=bool))
        mask[rows[group_of == i]] = True
    return RoutedRows(plan, sources)


def planned_rates(plan: RoutePlan) -> dict[tuple[str, str], float]:
    """Bytes/s the plan has each link (src, dst) carry: the rates of the trees that carry any group over it."""
    used = set(plan.groups.values())
    out: dict[tuple[str, str], float] = {}
    for i, tree in enumerate(plan.trees):
        if i not in used:
            continue
        for dst, src in tree.parent.items():
            out[(src, dst)] = out.get((src, dst), 0.0) + tree.rate
    return out
