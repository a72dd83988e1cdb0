"""A routed swarm's pure parts: which source each row is planned from (``swarm_routes``), and how a filler
follows that plan, waiting on a live relay and falling back when the relay is not live (``SwarmPlan``)."""

from __future__ import annotations

import numpy as np
import pytest
from configs import Cluster, FerryToml, Rule

from ferry.service.config import parse_config
from ferry.service.config_types import LinkSpec
from ferry.service.replication.routes import RouteError
from ferry.service.replication.swarm_plan import PeerView, SwarmPlan
from ferry.service.replication.swarm_routes import GROUPS, planned_rates, route_rows
from ferry.shard_tools.errors import ConfigError

MIB = 2**20
SIZES = np.full(200, 1_000_000)  # 200 shards of 1 MB: 0.2 GB
ALL = np.arange(200)


def _links(a_c_price: float = 0.09) -> list[LinkSpec]:
    return [
        LinkSpec("a", "b", 4 * MIB, 0.02),
        LinkSpec("a", "c", 4 * MIB, a_c_price),
        LinkSpec("b", "c", 4 * MIB, 0.0),
        LinkSpec("c", "b", 4 * MIB, 0.0),
    ]


def test_a_budget_that_only_the_relay_fits_routes_every_row_through_it() -> None:
    """The chain a → b → c costs 0.2 GB × $0.02; a copy straight to c costs $0.09 a GB more: a budget between
    the two (just above the chain's) leaves the chain only. b takes every row from a, c every row from b,
    whoever computes it."""
    budget = 0.2 * 0.02 * 1.01
    at_b = route_rows(SIZES, ALL, ["a"], ["b", "c"], "b", _links(), budget)
    at_c = route_rows(SIZES, ALL, ["a"], ["b", "c"], "c", _links(), budget)
    assert set(at_b.sources) == {"a"} and at_b.sources["a"].all()
    assert set(at_c.sources) == {"b"} and at_c.sources["b"].all()
    assert at_c.plan.cost <= budget
    assert planned_rates(at_c.plan) == {("a", "b"): 4 * MIB, ("b", "c"): 4 * MIB}
    assert at_c.source_of(7) == "b"


def test_the_fillers_plans_never_wait_on_each_other() -> None:
    """Without a budget the planner mixes trees; for every row, following each filler's planned source ends
    at a holder (no two fillers wait on each other for a row), and every row has one source per filler."""
    fillers = ["b", "c", "d"]
    links = [LinkSpec(s, d, (1 + (ord(s) * 7 + ord(d)) % 5) * MIB, 0.01) for s in "abcd" for d in "bcd" if s != d]
    plans = {f: route_rows(SIZES, ALL, ["a"], fillers, f, links) for f in fillers}
    for f, routed in plans.items():
        assert sum(m.astype(int) for m in routed.sources.values()).tolist() == [1] * 200, f
    for row in range(200):
        seen, at = set(), "b"
        while at != "a":
            assert at not in seen, f"row {row}: a cycle through {sorted(seen)}"
            seen.add(at)
            src = plans[at].sources
            at = next(s for s, m in src.items() if m[row])


def test_only_the_rows_to_copy_are_planned_and_groups_are_bounded() -> None:
    rows = np.arange(10, 200, 3)
    routed = route_rows(SIZES, rows, ["a"], ["b", "c"], "c", _links())
    planned = np.zeros(200, dtype=bool)
    for m in routed.sources.values():
        planned |= m
    assert planned.nonzero()[0].tolist() == rows.tolist()
    assert len(routed.plan.groups) == GROUPS
    few = route_rows(SIZES, np.array([5, 6]), ["a"], ["b", "c"], "c", _links())
    assert len(few.plan.groups) == 2


def test_no_route_and_no_budget_are_route_errors() -> None:
    with pytest.raises(RouteError, match="cannot be reached"):
        route_rows(SIZES, ALL, ["a"], ["b", "c"], "c", [LinkSpec("a", "b", MIB, 0.0)])
    with pytest.raises(RouteError, match="budget"):
        route_rows(SIZES, ALL, ["a"], ["b", "c"], "c", _links(), budget=0.0001)


def _plan(routes: dict[str, np.ndarray]) -> SwarmPlan:
    return SwarmPlan(np.arange(6), 6, "a", np.arange(6), routes=routes)


def _capacity(_source: str) -> float | None:
    return None


def test_a_row_planned_from_a_live_relay_waits_for_it_then_comes_from_it() -> None:
    from_b = np.array([True, True, True, False, False, False])
    plan = _plan({"b": from_b, "a": ~from_b})
    empty = np.zeros(6, dtype=bool)
    plan.update({"b": PeerView(empty, empty)})  # b is live and holds nothing yet
    started = [plan.next(_capacity) for _ in range(4)]
    assert [s for s in started if s is not None] == [(3, ("a",)), (4, ("a",)), (5, ("a",))]
    assert started[3] is None  # rows 0-2 wait for b
    plan.update({"b": PeerView(np.array([False, True, False, False, False, False]), empty)})
    assert plan.next(_capacity) == (1, ("b", "a"))
    assert plan.next(_capacity) is None


@pytest.mark.parametrize("view", ["stale", "missing"])
def test_rows_planned_from_a_relay_that_is_not_live_come_from_the_origin(view: str) -> None:
    from_b = np.array([True, True, False, False, False, False])
    plan = _plan({"b": from_b, "a": ~from_b})
    held = np.array([True, False, False, False, False, False])
    plan.update({"b": PeerView(held, None)} if view == "stale" else {})
    got = []
    while (nxt := plan.next(_capacity)) is not None:
        got.append(nxt)
    rows = {r: s[0] for r, s in got}
    assert sorted(rows) == list(range(6))
    assert rows[1] == "a"
    assert rows[0] == ("b" if view == "stale" else "a")  # b's verified rows still serve


def test_a_published_holder_is_never_an_orphaned_source() -> None:
    from_d = np.ones(6, dtype=bool)
    plan = _plan({"d": from_d})
    plan.update({"d": PeerView(np.ones(6, dtype=bool))})  # published: no in-flight set, holds everything
    got = [plan.next(_capacity) for _ in range(6)]
    assert all(g is not None and g[1][0] == "d" for g in got)


def test_the_swarm_section_takes_routed_and_a_budget(tmp_path: object) -> None:
    def doc(**swarm: object) -> dict[str, object]:
        d = FerryToml(clusters={c: Cluster(f"/tmp/{c}") for c in "ab"}, rules=[Rule("a", ["b"])]).doc()
        d["swarm"] = {"enabled": True, **swarm}
        return d

    cfg = parse_config(doc(routed=True, budget=12.5))
    assert (cfg.swarm.routed, cfg.swarm.budget) == (True, 12.5)
    assert parse_config(doc()).swarm.routed is False
    with pytest.raises(ConfigError, match="budget"):
        parse_config(doc(routed=True, budget=-1.0))
    zero = doc(routed=True)
    zero["links"] = [{"from": "a", "to": ["b"], "capacity": 0}]
    assert parse_config(zero).link_specs[("a", "b")].capacity is None  # 0 is "not known", as for every rate
