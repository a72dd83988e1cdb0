"""Routes by capacity and price: which cluster each destination copies each shard group from (pure, no I/O).

The model is a fluid one. Clusters are joined by directed links, each with a capacity (bytes/s) and an
egress price ($ per GB); a cluster may also cap all it sends (``egress``) or receives (``ingress``), as a
NIC does. Some clusters hold some shard groups; every destination must end up with every group.

The planner packs **distribution trees**: an arborescence rooted at the holders that reaches every
destination, each edge a link, each cluster receiving a group once from its parent in the tree (a holder,
or a destination that received it earlier in the same tree: a relay). A tree carries data at a rate
(its bottleneck in the capacity left by the trees before it); trees are packed greedily until the
destinations are cut off from the holders. Three packings are built, growing each tree along the widest
links, along relays first (chains that spare the holders' links), or along the cheapest links; the budget and the
deadline pick how much of which trees to use (a fractional knapsack on one constraint, exact for the
trees given); groups go to trees by earliest finish.

Why trees and a greedy rather than an LP: the data every destination wants is the same, so one copy on
a link serves every destination below it, which a per-destination flow LP cannot express without
network coding; Edmonds' branching theorem says packed arborescences reach the max-flow bound
``min_d maxflow(holders, d)`` when every cluster is a destination and only links are capacitated. The
greedy packing does not always find the optimal packing: :attr:`RoutePlan.lower_bound_s` (max-flow, per
destination, with node caps split out) is computed beside it so that every plan states how far from the
bound it is (``bound_ratio``). The tests check that ratio over generated topologies.

Shards are stored and forwarded whole (a relay serves a shard once it verified it), so a tree of depth
``k`` adds ``k - 1`` group transfers of pipeline delay: small groups make that delay small.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ferry.shard_tools.errors import ReplicationError

from ..config_types import LinkSpec

__all__ = [
    "NodeCaps",
    "ShardGroup",
    "Hop",
    "Tree",
    "RoutePlan",
    "RouteError",
    "LinkSpec",
    "plan_routes",
    "max_flow_rate",
]

_ROOT = "\x00holders"  # the super source joined to every holder
_EPS = 1e-9
GB = 1e9


class RouteError(ReplicationError):
    """The routes cannot be planned (a destination is unreachable, or no plan fits the budget)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


@dataclass(frozen=True)
class NodeCaps:
    """What one cluster can send (``egress``) and receive (``ingress``) in all, bytes/s (None = unbounded)."""

    egress: float | None = None
    ingress: float | None = None


@dataclass(frozen=True)
class ShardGroup:
    """Shards copied together: a name, their bytes, and the clusters that hold them now."""

    name: str
    size: int
    holders: frozenset[str]


@dataclass(frozen=True)
class Hop:
    """``dst`` copies ``group`` from ``src`` once ``src`` holds it (``stage`` 1 copies from a holder)."""

    group: str
    src: str
    dst: str
    stage: int


@dataclass(frozen=True)
class Tree:
    """A distribution tree: each destination's parent, its rate (bytes/s), its price per byte sent to all."""

    parent: Mapping[str, str]  # destination -> the cluster it copies from (a holder or another destination)
    rate: float
    price_per_byte: float  # sum of the tree's link prices, per byte of a group carried by it

    def depth(self, node: str) -> int:
        d = 0
        while node in self.parent:
            node, d = self.parent[node], d + 1
        return d


@dataclass
class RoutePlan:
    """Which trees carry which groups, and what the plan predicts."""

    hops: list[Hop] = field(default_factory=list)
    trees: list[Tree] = field(default_factory=list)
    groups: dict[str, int] = field(default_factory=dict)  # group -> index into trees
    fill_s: float = 0.0  # predicted time until every destination holds every group
    cost: float = 0.0  # $ of link egress
    egress: dict[str, float] = field(default_factory=dict)  # bytes each cluster sends
    lower_bound_s: float = 0.0  # max-flow bound on fill_s, whatever the plan

    @property
    def bound_ratio(self) -> float:
        return self.fill_s / self.lower_bound_s if self.lower_bound_s > 0 else 1.0

    def source_of(self, group: str, dst: str) -> str:
        """The cluster ``dst`` copies ``group`` from."""
        return self.trees[self.groups[group]].parent[dst]


def _cap(x: float | None) -> float:
    return math.inf if x is None else float(x)


class _Residual:
    """Capacity left on links and on each cluster's egress and ingress."""

    def __init__(self, links: Sequence[LinkSpec], caps: Mapping[str, NodeCaps], share: float = 1.0) -> None:
        self.link = {(ln.src, ln.dst): _cap(ln.capacity) * share for ln in links}
        self.price = {(ln.src, ln.dst): ln.price_per_gb / GB for ln in links}
        self.egress = {n: _cap(c.egress) * share for n, c in caps.items()}
        self.ingress = {n: _cap(c.ingress) * share for n, c in caps.items()}
        self.out: dict[str, list[str]] = {}
        for s, d in self.link:
            self.out.setdefault(s, []).append(d)


_ORDERS = ("wide", "relay", "cheap")  # the packings: how each tree grows


def _grow(res: _Residual, holders: frozenset[str], dests: frozenset[str], order: str) -> dict[str, str] | None:
    """One tree on the residual graph, grown from the holders one edge at a time (Prim's order): the widest
    edge leaving the tree (``wide``), the widest from a relay before any from a holder (``relay``: chains that
    spare the holders' links for later trees), or the cheapest, wider first (``cheap``). An edge's width shares
    its sender's egress with the children it already feeds, so wide fan-outs lose to relays. Only
    destinations join. None when some destination cannot be reached."""
    parent: dict[str, str] = {}
    fanout: dict[str, int] = {}
    reached = set(holders)
    while not dests <= reached:
        best: tuple[float, float, float, str, str] | None = None
        for s in reached:
            for d in res.out.get(s, ()):
                if d in reached or d not in dests:
                    continue
                w = min(
                    res.link[(s, d)], res.ingress.get(d, math.inf), res.egress.get(s, math.inf) / (fanout.get(s, 0) + 1)
                )
                if w <= _EPS:
                    continue
                price = res.price[(s, d)]
                first = price if order == "cheap" else float(s in holders) if order == "relay" else -w
                key = (first, -w, price, s, d)
                if best is None or key < best:
                    best = key
        if best is None:
            return None
        *_, s, d = best
        parent[d] = s
        fanout[s] = fanout.get(s, 0) + 1
        reached.add(d)
    return parent


def _tree_rate(res: _Residual, parent: Mapping[str, str]) -> float:
    """The rate a tree can carry in the residual capacity: each edge, each sender's egress over its fan-out."""
    fanout: dict[str, int] = {}
    for s in parent.values():
        fanout[s] = fanout.get(s, 0) + 1
    rate = math.inf
    for d, s in parent.items():
        rate = min(rate, res.link[(s, d)], res.ingress.get(d, math.inf))
    for s, k in fanout.items():
        rate = min(rate, res.egress.get(s, math.inf) / k)
    return rate


def _pack(res: _Residual, holders: frozenset[str], dests: frozenset[str], order: str) -> list[Tree]:
    """Trees until the holders are cut off from a destination; each one saturates a link or a cluster cap,
    so there are at most as many trees as links plus twice the clusters."""
    trees: list[Tree] = []
    limit = len(res.link) + 2 * len(res.out) + len(dests) * 2 + 2
    for _ in range(limit):
        parent = _grow(res, holders, dests, order)
        if parent is None:
            break
        rate = _tree_rate(res, parent)
        if rate <= _EPS or math.isinf(rate) and trees:
            break
        if math.isinf(rate):  # nothing bounds it: one tree carries everything at once
            trees.append(Tree(parent, rate, sum(res.price[(s, d)] for d, s in parent.items())))
            break
        for d, s in parent.items():
            res.link[(s, d)] -= rate
            if d in res.ingress:
                res.ingress[d] -= rate
            if s in res.egress:
                res.egress[s] -= rate
        trees.append(Tree(parent, rate, sum(res.price[(s, d)] for d, s in parent.items())))
    return trees


def _select(trees: Sequence[Tree], total: int, budget: float | None, deadline: float | None) -> list[float]:
    """How much of each tree's rate to use (a fraction each). Cost is ``total * sum(x r p) / sum(x r)``:
    the cheapest trees first, then dearer ones while the average price fits the budget (the exact optimum
    of this one-constraint LP over the trees given); with a deadline, stop once the rate meets it."""
    order = sorted(range(len(trees)), key=lambda i: trees[i].price_per_byte)
    x = [0.0] * len(trees)
    if total <= 0:  # nothing to move: the cheapest tree carries it
        x[order[0]] = 1.0
        return x
    cap = math.inf if budget is None or not total else budget * (1 + 1e-9) / total  # average price allowed a byte
    need = math.inf if deadline is None else total / deadline
    rate = slack = 0.0  # slack: sum of x r (cap - p), never below 0
    for i in order:
        t = trees[i]
        margin = cap - t.price_per_byte
        if math.isinf(t.rate):
            if margin >= -1e-18:
                x[i] = 1.0
                return x
            continue
        use = min(t.rate, need - rate)
        if margin < 0:
            use = min(use, slack / -margin)
        if use <= 0:
            break
        x[i] = use / t.rate
        rate += use
        slack += use * margin if not math.isinf(margin) else 0.0
    return x


def _assign(
    trees: Sequence[Tree], x: Sequence[float], groups: Sequence[ShardGroup], rtt: float, budget: float | None
) -> tuple[dict[str, int], float]:
    """Each group to the tree where it finishes first (largest groups first); then, while the groups' cost
    is over ``budget``, groups move from the dearest tree to the cheapest (whose price fits the budget,
    as :func:`_select` picked it). Returns where each group goes and when the last tree finishes."""
    live = [i for i in range(len(trees)) if x[i] > 0]
    if not live:
        raise RouteError("no tree fits the budget")
    finish = _Finish(trees, x, live, rtt)
    where: dict[str, int] = {}
    for g in sorted(groups, key=lambda g: (-g.size, g.name)):
        i = min(live, key=lambda i: (finish.after(i, g.size), i))
        where[g.name] = i
        finish.add(i, g.size)
    if budget is not None:
        cheapest = min(live, key=lambda i: (trees[i].price_per_byte, i))
        cost = sum(g.size * trees[where[g.name]].price_per_byte for g in groups)
        movable = sorted(groups, key=lambda g: (-trees[where[g.name]].price_per_byte, -g.size, g.name))
        for g in movable:
            if cost <= budget * (1 + 1e-12) or where[g.name] == cheapest:
                break
            cost -= g.size * (trees[where[g.name]].price_per_byte - trees[cheapest].price_per_byte)
            where[g.name] = cheapest
        finish = _Finish(trees, x, live, rtt)
        for g in groups:
            finish.add(where[g.name], g.size)
    return where, max((finish.after(i, 0) for i in live if finish.carried[i]), default=0.0)


class _Finish:
    """When each tree finishes: a tree of rate r carrying B bytes, its deepest destination k hops down,
    finishes at ``(B + (k - 1) * its largest group) / r`` plus k round trips (store and forward)."""

    def __init__(self, trees: Sequence[Tree], x: Sequence[float], live: Sequence[int], rtt: float) -> None:
        self.rate = {i: trees[i].rate * x[i] for i in live}
        self.depth = {i: max(trees[i].depth(d) for d in trees[i].parent) for i in live}
        self.carried = dict.fromkeys(live, 0)
        self.largest = dict.fromkeys(live, 0)
        self.rtt = rtt

    def after(self, i: int, extra: int) -> float:
        if math.isinf(self.rate[i]):
            return self.depth[i] * self.rtt
        big = max(self.largest[i], extra)
        return (self.carried[i] + extra + (self.depth[i] - 1) * big) / self.rate[i] + self.depth[i] * self.rtt

    def add(self, i: int, size: int) -> None:
        self.carried[i] += size
        self.largest[i] = max(self.largest[i], size)


def plan_routes(
    groups: Sequence[ShardGroup],
    destinations: Sequence[str],
    links: Sequence[LinkSpec],
    *,
    caps: Mapping[str, NodeCaps] | None = None,
    budget: float | None = None,
    deadline: float | None = None,
) -> RoutePlan:
    """Pick, per shard group, the cluster each destination copies it from.

    ``budget``: $ of link egress the whole plan may spend (None = no limit). ``deadline``: seconds; when
    set, the cheapest plan that meets it is chosen (the fastest within budget when none does); else the
    fastest plan within the budget. Groups with the same holders are planned together; sets of groups
    with different holders are copied at once, sharing every link and cap in proportion to their bytes
    (as is their share of the budget).
    """
    caps = caps or {}
    dests = frozenset(destinations)
    _check(groups, links, budget, deadline)
    classes: dict[frozenset[str], list[ShardGroup]] = {}
    for g in groups:
        classes.setdefault(g.holders, []).append(g)
    everything = max(1, sum(g.size for g in groups))
    rtt = max((ln.rtt for ln in links), default=0.0)
    work = []  # (members, the two packings, the least this set of groups can cost, what it costs unconstrained)
    for holders, members in sorted(classes.items(), key=lambda kv: -sum(g.size for g in kv[1])):
        want = dests - holders
        if not want:
            continue
        total = sum(g.size for g in members)
        packings = []
        for order in _ORDERS:
            share = total / everything if total else 1.0  # a set of empty groups moves nothing: any share
            trees = _pack(_Residual(links, caps, share), holders, want, order)
            if not trees:
                raise RouteError(f"destinations {sorted(want)} cannot be reached from {sorted(holders)}")
            packings.append(trees)
        least = total * min(t.price_per_byte for trees in packings for t in trees)
        free = _cost(_choose(_options(packings, members, None, deadline, rtt), members, deadline), members)
        work.append((members, packings, least, free))
    plan = RoutePlan()
    cheapest = sum(w[2] for w in work)
    spare = None if budget is None else budget - cheapest
    if spare is not None and spare < -1e-9 * max(1.0, cheapest):
        raise RouteError(f"no route fits the budget of {budget}: the cheapest plan costs {cheapest}")
    # what each group set's free plan costs above its cheapest, never below 0: rounding makes some tiny and
    # negative, and a share of the spare computed from those was negative too (a budget under the cheapest)
    extras = [max(0.0, w[3] - w[2]) for w in work]
    excess = sum(extras)
    for (members, packings, least, _free), extra in zip(work, extras, strict=True):
        share = extra / excess if excess > 0 else 1.0 / len(work)
        allowed = None if spare is None else least + max(0.0, spare) * share
        options = _options(packings, members, allowed, deadline, rtt)
        if not options:
            raise RouteError(f"no route fits the budget of {budget} for groups held by {sorted(members[0].holders)}")
        best = _choose(options, members, deadline)
        _record(plan, best.trees, best.x, best.where, members, best.fill)
    plan.lower_bound_s = _lower_bound(groups, dests, links, caps)
    return plan


def _check(
    groups: Sequence[ShardGroup], links: Sequence[LinkSpec], budget: float | None, deadline: float | None
) -> None:
    """Inputs a plan cannot be made of: a RouteError naming the first."""
    names: set[str] = set()
    for g in groups:
        if not g.holders or g.size < 0 or g.name in names:
            raise RouteError(f"group {g.name!r}: needs a holder, a size >= 0 and a name of its own")
        names.add(g.name)
    for ln in links:
        numbers = (ln.price_per_gb, ln.rtt, 1.0 if ln.capacity is None else ln.capacity)
        if not all(math.isfinite(x) and x >= 0 for x in numbers) or ln.capacity == 0:
            raise RouteError(f"link {ln.src}->{ln.dst}: capacity > 0, price and rtt >= 0, all finite")
    if budget is not None and not (math.isfinite(budget) and budget >= 0):
        raise RouteError(f"budget: expected $ >= 0, got {budget!r}")
    if deadline is not None and not deadline > 0:
        raise RouteError(f"deadline: expected seconds > 0, got {deadline!r}")


def _options(
    packings: Sequence[list[Tree]],
    members: Sequence[ShardGroup],
    budget: float | None,
    deadline: float | None,
    rtt: float,
) -> list[_Option]:
    """Each packing's trees put to use within ``budget``; with a deadline, more rate is asked for until the
    store-and-forward delay fits too."""
    total = sum(g.size for g in members)
    options: list[_Option] = []
    for trees in packings:
        x = _select(trees, total, budget, None)  # the fastest within budget: the fallback when no deadline is met
        if any(x):
            options.append(_Option(trees, x, *_assign(trees, x, members, rtt, budget)))
        target = deadline
        for _ in range(4 if deadline is not None else 0):
            x = _select(trees, total, budget, target)
            if not any(x):
                break
            where, fill = _assign(trees, x, members, rtt, budget)
            options.append(_Option(trees, x, where, fill))
            if deadline is None or target is None or fill <= deadline:
                break
            target = target * deadline / fill
    return options


def _cost(option: _Option, members: Sequence[ShardGroup]) -> float:
    return sum(g.size * option.trees[option.where[g.name]].price_per_byte for g in members)


class _Option(NamedTuple):
    trees: list[Tree]
    x: list[float]
    where: dict[str, int]
    fill: float


def _choose(options: Sequence[_Option], members: Sequence[ShardGroup], deadline: float | None) -> _Option:
    """The cheapest option that meets the deadline, else the fastest."""

    def cost(o: _Option) -> float:
        return _cost(o, members)

    meets = [o for o in options if deadline is not None and o.fill <= deadline]
    if meets:
        return min(meets, key=lambda o: (cost(o), o.fill))
    return min(options, key=lambda o: (o.fill, cost(o)))


def _record(
    plan: RoutePlan,
    trees: list[Tree],
    x: list[float],
    where: dict[str, int],
    members: Sequence[ShardGroup],
    fill: float,
) -> None:
    base = len(plan.trees)
    plan.trees.extend(Tree(t.parent, t.rate * f, t.price_per_byte) for t, f in zip(trees, x, strict=True))
    for g in members:
        tree = trees[where[g.name]]
        plan.groups[g.name] = base + where[g.name]
        for d, s in tree.parent.items():
            plan.hops.append(Hop(g.name, s, d, tree.depth(d)))
            plan.egress[s] = plan.egress.get(s, 0.0) + g.size
        plan.cost += g.size * tree.price_per_byte
    plan.hops.sort(key=lambda h: (h.stage, h.group, h.dst))
    plan.fill_s = max(plan.fill_s, fill)


def _lower_bound(
    groups: Sequence[ShardGroup], dests: frozenset[str], links: Sequence[LinkSpec], caps: Mapping[str, NodeCaps]
) -> float:
    """No plan fills faster than the slowest destination's ``bytes it lacks / max-flow from the holders``
    (one cut per destination; relays only move bytes that crossed it)."""
    bound = 0.0
    for d in dests:
        need = sum(g.size for g in groups if d not in g.holders)
        if not need:
            continue
        holders = frozenset().union(*(g.holders for g in groups if d not in g.holders))
        flow = max_flow_rate(holders, d, links, caps)
        bound = max(bound, 0.0 if math.isinf(flow) else need / flow if flow > 0 else math.inf)
    return bound


def max_flow_rate(
    sources: frozenset[str], sink: str, links: Sequence[LinkSpec], caps: Mapping[str, NodeCaps] | None = None
) -> float:
    """The max-flow rate (bytes/s) from ``sources`` to ``sink`` (Edmonds–Karp). A cluster is split into
    ``in -> mid -> out`` so that its ingress and egress caps are edges; flow enters at a source's ``mid``
    and leaves at the sink's ``mid``."""
    caps = caps or {}
    cap: dict[tuple[str, str], float] = {}
    nodes = {ln.src for ln in links} | {ln.dst for ln in links} | set(sources) | {sink}
    for n in nodes:
        c = caps.get(n, NodeCaps())
        cap[(f"i{n}", f"m{n}")] = _cap(c.ingress)
        cap[(f"m{n}", f"o{n}")] = _cap(c.egress)
    for ln in links:
        key = (f"o{ln.src}", f"i{ln.dst}")
        cap[key] = cap.get(key, 0.0) + _cap(ln.capacity)
    for s in sources:
        cap[(_ROOT, f"m{s}")] = math.inf
    return _edmonds_karp(cap, _ROOT, f"m{sink}")


def _edmonds_karp(cap: dict[tuple[str, str], float], s: str, t: str) -> float:
    adj: dict[str, set[str]] = {}
    for a, b in list(cap):
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
        cap.setdefault((b, a), 0.0)
    flow = 0.0
    while True:
        prev: dict[str, str] = {s: s}
        queue = deque([s])
        while queue and t not in prev:
            u = queue.popleft()
            for v in adj.get(u, ()):
                if v not in prev and cap[(u, v)] > _EPS:
                    prev[v] = u
                    queue.append(v)
        if t not in prev:
            return flow
        push, v = math.inf, t
        while v != s:
            push, v = min(push, cap[(prev[v], v)]), prev[v]
        if math.isinf(push):
            return math.inf
        v = t
        while v != s:
            u = prev[v]
            cap[(u, v)] -= push
            cap[(v, u)] += push
            v = u
        flow += push
