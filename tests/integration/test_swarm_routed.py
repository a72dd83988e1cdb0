"""A routed swarm (``[swarm] routed``) on a real mesh in one process: origin ``a``, fillers ``b`` and ``c``, one
daemon per filler. The ``[[links]]`` price ``a → c`` high and ``b → c`` free, and the budget fits only the
chain ``a → b → c``: ``c`` takes every shard from ``b`` while ``b`` fills, and the origin sends each shard
once. The same mesh unrouted pulls from the origin at ``c`` too; with ``b`` down, ``c`` stops waiting for it
after ``stale_after`` and fills from the origin; a budget no plan fits falls back to the unrouted swarm."""

from __future__ import annotations

import json
import os
import queue
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from configs import Cluster, FerryToml, Limits, Link, Rule, Swarm
from helpers import pack, wait_until

from ferry.service import Daemon
from ferry.service.api.daemon_backend import DaemonBackend
from ferry.service.config import parse_config
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve

DATASET = "corpus"
MIB = 2**20
RATE = 2 * MIB


def _daemon(root: Path, me: str, routed: bool, budget: float | None) -> Daemon:
    per_link = {"b": {"a->b": RATE}, "c": {"a->c": RATE, "b->c": RATE}}[me]
    doc = FerryToml(
        clusters={c: Cluster(root / c) for c in "abc"},
        rules=[Rule("a", ["b", "c"])],
        links=[
            Link("a", "b", price_per_gb=0.02),
            Link("a", "c", price_per_gb=0.09),
            Link(["b"], ["c"], price_per_gb=0.0),
            Link(["c"], ["b"], price_per_gb=0.0),
        ],
        limits=Limits(transfers=3, retries=3, per_link=per_link),
        state_dir=root / f"state-{me}",
        poll_interval=0.1,
        cluster=me,
        swarm=Swarm(enabled=True, interval=0.1, stale_after=1.0, routed=routed, budget=budget),
    ).doc()
    return Daemon(parse_config(doc, base_dir=root))


def _fill(root: Path, run: str, budget: float | None) -> tuple[dict[str, Daemon], dict[str, list[dict[str, Any]]]]:
    """Start daemons for ``run`` ("routed", "unrouted" or "c-alone"), publish the dataset at ``a``, wait for
    every started filler to publish; return the daemons (still running) and each one's events."""
    for c in "abc":
        (root / c).mkdir(parents=True)
    pack(str(root / "staged"), [np.full(30_000, i + 1, dtype=np.uint16) for i in range(40)], shard_size=64 * 1024)
    names = "c" if run == "c-alone" else "bc"
    daemons = {me: _daemon(root, me, run != "unrouted", budget) for me in names}
    subs = {me: d.events.subscribe(maxsize=100_000) for me, d in daemons.items()}
    for d in daemons.values():
        d.start()
    os.rename(root / "staged", root / "a" / DATASET)
    events: dict[str, list[dict[str, Any]]] = {me: [] for me in names}

    def published() -> bool:
        for me, q in subs.items():
            while True:
                try:
                    events[me].append(q.get_nowait())
                except queue.Empty:
                    break
        return all(any(e["type"] == "version_published" for e in events[me]) for me in names)

    try:
        wait_until(published, 90, f"{names} publish")
    except BaseException:
        for d in daemons.values():
            d.stop(timeout=5)
        raise
    origin = load_manifest(resolve(str(root / "a" / DATASET)))
    for me in names:
        for info in origin.shards:
            assert digest_bytes((root / me / DATASET / info.path).read_bytes()) == info.stored_digest
    return daemons, events


def _sources(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["source"] for e in events if e["type"] == "shard_verified")


def _stop(daemons: dict[str, Daemon]) -> None:
    for d in daemons.values():
        d.stop(timeout=5)


def test_the_fillers_follow_the_routed_plan_and_the_origin_sends_each_shard_once(tmp_path: Path) -> None:
    # the budget: 1.01× what the chain costs (the dataset's bytes once over a → b at $0.02 a GB); the same
    # documents packed alike give the same bytes
    pack(str(tmp_path / "probe"), [np.full(30_000, i + 1, dtype=np.uint16) for i in range(40)], shard_size=64 * 1024)
    probe = load_manifest(resolve(str(tmp_path / "probe")))
    shards = len(probe.shards)
    budget = sum(i.stored_bytes for i in probe.shards) / 1e9 * 0.02 * 1.01
    daemons, events = _fill(tmp_path / "routed", "routed", budget)
    try:
        assert _sources(events["b"]) == Counter({"a": shards})
        assert _sources(events["c"]) == Counter({"b": shards}), "c copied over a link the plan does not use"
        planned = daemons["c"].planned_rates()
        assert planned == {("a", "b"): RATE, ("b", "c"): RATE}
        backend = DaemonBackend(daemons["c"], daemons["c"].config.api)
        try:
            links = {(lk.source, lk.destination): lk for lk in backend.links()}
        finally:
            backend.close()
        assert links[("b", "c")].planned_bps == RATE and links[("a", "c")].planned_bps is None
        assert links[("b", "c")].egress and links[("b", "c")].egress[0].cost == 0.0
        assert ("a", "c") not in {k for k, lk in links.items() if lk.egress}
        assert daemons["c"].errors() == []
    finally:
        _stop(daemons)
    daemons, events = _fill(tmp_path / "unrouted", "unrouted", None)
    _stop(daemons)
    assert _sources(events["c"])["a"] > 0, "unrouted, c pulls its own rows from the origin: the test above tells"


def test_a_relay_that_never_fills_is_waited_for_stale_after_then_the_origin_serves(tmp_path: Path) -> None:
    """b's daemon is not running: c's plan routes everything through b, which writes no set; c waits while
    patient (stale_after = 1 s here), then takes every shard from the origin."""
    t0 = time.monotonic()
    daemons, events = _fill(tmp_path, "c-alone", None)
    _stop(daemons)
    assert time.monotonic() - t0 < 60
    assert _sources(events["c"])["a"] == len(load_manifest(resolve(str(tmp_path / "a" / DATASET))).shards)


def test_a_budget_no_plan_fits_is_reported_and_the_swarm_balances_load_instead(tmp_path: Path) -> None:
    daemons, events = _fill(tmp_path, "routed", 1e-12)
    try:
        errors = [e for me in "bc" for e in events[me] if e["type"] == "error"]
        assert errors and all("balancing load instead" in e["reason"] and "budget" in e["reason"] for e in errors)
        assert daemons["c"].planned_rates() == {}
        open_errors = [e for e in daemons["c"].errors() if e.shard == "(swarm routes)"]
        assert len(open_errors) == 1 and "budget" in open_errors[0].reason
    finally:
        _stop(daemons)


@pytest.mark.parametrize(
    "bad",
    [
        {"routed": True, "budget": -1.0},
        {"routed": True, "budget": "ten"},
        {"routed": "yes"},
        {"routed": True, "enabled": False},
        {"budget": 5.0},
    ],
)
def test_a_bad_swarm_section_is_refused(tmp_path: Path, bad: dict[str, Any]) -> None:
    from ferry.shard_tools.errors import ConfigError

    doc = json.loads(json.dumps(FerryToml(clusters={c: Cluster(tmp_path / c) for c in "ab"},
                                          rules=[Rule("a", ["b"])]).doc()))  # fmt: skip
    doc["swarm"] = {"enabled": True, **bad}
    with pytest.raises(ConfigError, match="swarm"):
        parse_config(doc, base_dir=tmp_path)
