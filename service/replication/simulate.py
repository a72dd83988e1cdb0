"""Predict a fleet's replication: fill time, origin egress and cost per version, for today's tree of whole
versions and for the routed plan of :func:`~ferry.service.replication.routes.plan_routes`.

``python -m ferry.service.replication.simulate --help``. The functions are pure (a fluid simulation,
:mod:`ferry.service.replication.fleet_sim`); :func:`main` reads its arguments (and a ``ferry.toml`` for
``[[links]]`` when given) and prints.

**Tree of whole versions** (what the daemons do today): each destination copies the version from one
source cluster (its rule's source, or the parent ``--tree`` names), and a cluster serves a version to its
peers only once it published all of it. **Routed**: the version is cut into shard groups and each
destination copies each group from the cluster the route planner picks, a relay forwarding a group as
soon as it holds it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from ferry.shard_tools.errors import FerryError
from ferry.shard_tools.units import parse_rate, parse_size

from ..config_types import LinkSpec
from .fleet_sim import Flow, simulate_flows
from .routes import GB, NodeCaps, ShardGroup, plan_routes

__all__ = ["Fleet", "Outcome", "simulate_tree", "simulate_routed", "uniform_fleet", "main"]


@dataclass(frozen=True)
class Fleet:
    """Clusters, the links between them, their NIC caps, and the origin where versions are packed."""

    clusters: tuple[str, ...]
    links: tuple[LinkSpec, ...]
    caps: Mapping[str, NodeCaps]
    origin: str


@dataclass(frozen=True)
class Outcome:
    """One version's replication: seconds until every cluster holds it, bytes the origin sent, $ of egress."""

    plan: str
    bytes: int
    fill_s: float
    origin_egress: float
    cost: float
    predicted_s: float | None = None  # the route planner's own estimate (routed plans)
    lower_bound_s: float | None = None  # max-flow bound


def _price(fleet: Fleet) -> dict[tuple[str, str], float]:
    return {(ln.src, ln.dst): ln.price_per_gb / GB for ln in fleet.links}


def simulate_tree(fleet: Fleet, size: int, parent: Mapping[str, str] | None = None) -> Outcome:
    """A whole version of ``size`` bytes down a tree (``parent``: destination -> source; default: every
    destination from the origin). A child starts when its parent has the whole version."""
    parent = parent or {c: fleet.origin for c in fleet.clusters if c != fleet.origin}
    order = _topological(parent, fleet.origin)
    index = {d: i for i, d in enumerate(order)}
    flows = [Flow(parent[d], d, size, () if parent[d] == fleet.origin else (index[parent[d]],)) for d in order]
    fill = simulate_flows(flows, fleet.links, fleet.caps)
    price = _price(fleet)
    cost = sum(size * price[(f.src, f.dst)] for f in flows)
    origin = sum(size for f in flows if f.src == fleet.origin)
    return Outcome("tree", size, fill, origin, cost)


def _topological(parent: Mapping[str, str], root: str) -> list[str]:
    order: list[str] = []
    seen = {root}
    for d in parent:
        chain = []
        while d not in seen:
            if d in chain or d not in parent:
                raise ValueError(f"the tree does not lead every cluster back to {root}: {dict(parent)}")
            chain.append(d)
            d = parent[d]
        for c in reversed(chain):
            seen.add(c)
            order.append(c)
    return order


def simulate_routed(fleet: Fleet, size: int, groups: int = 64, budget: float | None = None) -> Outcome:
    """The version cut into ``groups`` equal shard groups, routed by :func:`plan_routes` (within ``budget``
    $ when given), then simulated group by group."""
    n = max(1, min(groups, size))
    sizes = [size // n + (1 if i < size % n else 0) for i in range(n)]
    gs = [ShardGroup(f"g{i}", s, frozenset({fleet.origin})) for i, s in enumerate(sizes)]
    dests = [c for c in fleet.clusters if c != fleet.origin]
    plan = plan_routes(gs, dests, fleet.links, caps=fleet.caps, budget=budget)
    flows: list[Flow] = []
    arrived: dict[tuple[str, str], int] = {}  # (group, cluster) -> the flow bringing it there
    for hop in sorted(plan.hops, key=lambda h: (int(h.group[1:]), h.stage, h.dst)):
        after = () if (hop.group, hop.src) not in arrived else (arrived[(hop.group, hop.src)],)
        arrived[(hop.group, hop.dst)] = len(flows)
        flows.append(Flow(hop.src, hop.dst, sizes[int(hop.group[1:])], after))
    fill = simulate_flows(flows, fleet.links, fleet.caps)
    origin = sum(f.size for f in flows if f.src == fleet.origin)
    return Outcome("routed", size, fill, origin, plan.cost, plan.fill_s, plan.lower_bound_s)


def uniform_fleet(
    n: int,
    capacity: float | None,
    *,
    nic: float | None = None,
    price: float = 0.0,
    origin_price: float | None = None,
    rtt: float = 0.0,
) -> Fleet:
    """``n`` clusters ``c0``..``c{n-1}`` (``c0`` the origin), every pair linked both ways at ``capacity``
    bytes/s and ``price`` $/GB (``origin_price`` for links out of the origin), each cluster's NIC capped
    at ``nic`` bytes/s each way."""
    names = tuple(f"c{i}" for i in range(n))
    links = tuple(
        LinkSpec(a, b, capacity, price if a != names[0] or origin_price is None else origin_price, rtt)
        for a in names
        for b in names
        if a != b
    )
    return Fleet(names, links, {c: NodeCaps(nic, nic) for c in names}, names[0])


def _from_config(path: str, nic: float | None) -> tuple[Fleet, dict[str, str]]:
    """The fleet a ``ferry.toml`` describes, and today's tree of it."""
    from ..config import load_config

    cfg = load_config(path)
    tree: dict[str, str] = {}
    for rule in cfg.rules:
        for d in rule.destinations:
            tree.setdefault(d, rule.source)
    names = tuple(cfg.clusters)
    caps = {c: NodeCaps(nic, nic) for c in names}
    return Fleet(names, tuple(cfg.link_specs.values()), caps, cfg.rules[0].source), tree


def _parse_tree(text: str) -> dict[str, str]:
    """``"c1=c0,c2=c1"`` -> {c1: c0, c2: c1}."""
    out = {}
    for part in filter(None, text.split(",")):
        child, sep, par = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected CHILD=PARENT, got {part!r}")
        out[child.strip()] = par.strip()
    return out


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m ferry.service.replication.simulate", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--clusters", type=int, default=10, help="clusters in the fleet, the origin included")
    p.add_argument("--dataset", type=parse_size, default=parse_size("100TB"), help="bytes of the initial fill")
    p.add_argument("--delta", type=parse_size, default=parse_size("1TB"), help="bytes each new version adds")
    p.add_argument("--cadence", type=float, default=86400.0, help="seconds between two versions")
    p.add_argument("--capacity", type=parse_rate, default=None, help="every link's capacity (default: unbounded)")
    p.add_argument(
        "--nic", type=parse_rate, default=parse_rate("1.25GB/s"), help="each cluster's egress and ingress cap"
    )
    p.add_argument("--price", type=float, default=0.0, help="$ per GB on links between destinations")
    p.add_argument("--origin-price", type=float, default=None, help="$ per GB out of the origin (default: --price)")
    p.add_argument("--rtt", type=float, default=0.0, help="seconds, every link")
    p.add_argument("--groups", type=int, default=64, help="shard groups a version is routed in")
    p.add_argument("--budget", type=float, default=None, help="$ of egress per version for the routed plan")
    p.add_argument(
        "--tree", type=_parse_tree, default=None, help="today's tree as CHILD=PARENT,... (default: all from c0)"
    )
    p.add_argument("--config", default=None, help="a ferry.toml: its clusters, [[links]] and rules (the tree: each "
                   "destination follows its first rule's source; the origin is the first rule's) replace the flags "
                   "--clusters, --capacity, --price, --origin-price, --rtt")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = _args(argv)
    fleet = uniform_fleet(a.clusters, a.capacity, nic=a.nic, price=a.price, origin_price=a.origin_price, rtt=a.rtt)
    if a.config:
        try:
            fleet, tree = _from_config(a.config, a.nic)
        except FerryError as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
        a.tree = a.tree or tree
    rows = []
    for what, size in (("fill", a.dataset), ("version", a.delta)):
        budget = a.budget if what == "version" else None if a.budget is None else a.budget * a.dataset / a.delta
        try:
            outcomes = (simulate_tree(fleet, size, a.tree), simulate_routed(fleet, size, a.groups, budget))
        except (FerryError, ValueError) as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
        for out in outcomes:
            rows.append({"what": what, **asdict(out), "keeps_up": what == "fill" or out.fill_s <= a.cadence})
    if a.json:
        json.dump({"clusters": a.clusters, "nic": a.nic, "capacity": a.capacity, "rows": rows}, sys.stdout, indent=1)
        print()
        return 0
    print(f"{'what':8} {'plan':7} {'fill h':>8} {'origin egress':>14} {'cost $':>10} {'bound h':>8}")
    for r in rows:
        bound = "" if r["lower_bound_s"] is None else f"{r['lower_bound_s'] / 3600:.2f}"
        fill, egress = r["fill_s"] / 3600, r["origin_egress"]
        print(f"{r['what']:8} {r['plan']:7} {fill:>8.2f} {egress:>14.3g} {r['cost']:>10.0f} {bound:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
