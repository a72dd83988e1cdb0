"""The fleet simulator: the fluid flows against arithmetic, today's tree of whole versions, the routed plan
against the planner's own estimate and the max-flow bound, and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferry.service.config_types import LinkSpec
from ferry.service.replication.fleet_sim import Flow, simulate_flows
from ferry.service.replication.routes import NodeCaps
from ferry.service.replication.simulate import simulate_routed, simulate_tree, uniform_fleet

TB = 10**12
NIC = 1.25e9


def test_flows_share_a_sender_fairly_and_wait_for_what_they_forward() -> None:
    links = [LinkSpec("o", "a", None, rtt=0.5), LinkSpec("o", "b", None), LinkSpec("a", "c", 1e9)]
    flows = [Flow("o", "a", 2e9), Flow("o", "b", 2e9), Flow("a", "c", 1e9, after=(0,))]
    end = simulate_flows(flows, links, {"o": NodeCaps(egress=2e9)})
    # o->b runs alone at 2 GB/s during o->a's round trip (1 GB), then both share o's 2 GB/s: b ends at
    # 1.5 s, a (1 GB moved by then) has the whole 2 GB/s for its last GB, and c gets it after a holds it
    assert flows[1].end == pytest.approx(1.5)
    assert flows[0].start == pytest.approx(0.5) and flows[0].end == pytest.approx(2.0)
    assert flows[2].start == pytest.approx(2.0) and end == pytest.approx(3.0)


def test_a_flow_without_a_link_is_refused() -> None:
    with pytest.raises(ValueError, match="no link"):
        simulate_flows([Flow("a", "b", 1.0)], [LinkSpec("b", "a", 1.0)])


def test_today_everyone_pulls_from_the_origin_and_shares_its_nic() -> None:
    fleet = uniform_fleet(10, None, nic=NIC, price=0.02, origin_price=0.09)
    star = simulate_tree(fleet, 100 * TB)
    assert star.fill_s == pytest.approx(9 * 100 * TB / NIC)
    assert star.origin_egress == 9 * 100 * TB and star.cost == pytest.approx(9 * 100_000 * 0.09)
    chain = simulate_tree(fleet, 100 * TB, {f"c{i}": f"c{i - 1}" for i in range(1, 10)})
    assert chain.fill_s == pytest.approx(9 * 100 * TB / NIC)  # whole versions: one hop after another
    assert chain.origin_egress == 100 * TB and chain.cost == pytest.approx(100_000 * (0.09 + 8 * 0.02))


def test_a_tree_that_does_not_reach_the_origin_is_refused() -> None:
    fleet = uniform_fleet(3, None, nic=NIC)
    with pytest.raises(ValueError, match="back to c0"):
        simulate_tree(fleet, TB, {"c1": "c2", "c2": "c1"})


@pytest.mark.parametrize(("capacity", "nic"), [(None, NIC), (NIC, 10 * NIC), (0.3 * NIC, NIC)])
def test_the_routed_plan_runs_as_the_planner_predicts(capacity: float | None, nic: float) -> None:
    fleet = uniform_fleet(6, capacity, nic=nic, price=0.02, origin_price=0.09)
    routed = simulate_routed(fleet, 10 * TB, groups=32)
    assert routed.lower_bound_s is not None and routed.predicted_s is not None
    assert routed.fill_s >= routed.lower_bound_s * (1 - 1e-9)
    assert routed.fill_s == pytest.approx(routed.predicted_s, rel=0.15)
    assert routed.fill_s < simulate_tree(fleet, 10 * TB).fill_s


def test_the_command_line_prints_json(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, "-m", "ferry.service.replication.simulate", "--clusters", "4", "--dataset", "1TB"]
    out = subprocess.run([*argv, "--delta", "10GB", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert [(r["what"], r["plan"]) for r in rows] == [
        ("fill", "tree"),
        ("fill", "routed"),
        ("version", "tree"),
        ("version", "routed"),
    ]
    assert rows[0]["fill_s"] == pytest.approx(3 * 1e12 / NIC)
    bad = subprocess.run([*argv, "--tree", "c1"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "CHILD=PARENT" in bad.stderr
    broke = subprocess.run(
        [*argv, "--price", "0.02", "--budget", "0.01"], capture_output=True, text=True, env=env, timeout=60
    )
    assert broke.returncode == 2 and "no route fits the budget" in broke.stderr and "Traceback" not in broke.stderr


def test_a_ferry_toml_gives_the_fleet_and_todays_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ferry.service.replication.simulate import main

    clusters = "".join(f'[clusters.{c}]\nurl = "{tmp_path / c}"\n' for c in ("east", "west", "north"))
    rules = '[[rules]]\nfrom = "east"\nto = ["west"]\n[[rules]]\nfrom = "west"\nto = ["north"]\n'
    links = '[[links]]\nfrom = "*"\nto = "*"\ncapacity = "1GB/s"\nprice_per_gb = 0.02\n'
    path = tmp_path / "ferry.toml"
    path.write_text(clusters + rules + links)
    assert main(["--config", str(path), "--dataset", "1TB", "--delta", "1GB", "--nic", "off", "--json"]) == 0
    fill_tree, fill_routed = json.loads(capsys.readouterr().out)["rows"][:2]
    assert fill_tree["fill_s"] == pytest.approx(2 * 1e12 / 1e9)  # east -> west, then west -> north
    assert fill_tree["cost"] == pytest.approx(2 * 1000 * 0.02) and fill_tree["origin_egress"] == 1e12
    assert fill_routed["fill_s"] < fill_tree["fill_s"]
    path.write_text(clusters + rules + '[[links]]\nfrom = "east"\nto = "west"\n')  # no link west -> north
    assert main(["--config", str(path)]) == 2
    assert "no link west->north" in capsys.readouterr().err
