"""The swarm's pure parts: how rows are dealt to the fillers, which row a free transfer starts and from where,
the verified set's encoding (and what it refuses), and the ``[swarm]`` section."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from configs import Cluster, FerryToml, Rule

from ferry.service.config import parse_config
from ferry.service.replication.swarm_plan import PeerView, SwarmPlan, origin_order
from ferry.service.replication.swarm_set import SwarmSet, read_swarm, swarm_path
from ferry.shard_tools.errors import ConfigError, ManifestError
from ferry.shard_tools.storage.store import resolve


@pytest.mark.parametrize("n_fillers", [1, 2, 3, 5])
def test_rows_are_dealt_once_to_an_owner_and_once_to_a_first_helper(n_fillers: int) -> None:
    """Filler i owns rows i, i+n, ... (ascending, first); of each other row it helps first, from the end, where
    (row // n) % (n - 1), counted over the fillers but the owner, is i; every other row comes last."""
    fillers = [f"f{i}" for i in range(n_fillers)]
    rows = np.arange(101)
    helpers_of: dict[int, set[str]] = {r: set() for r in range(101)}
    for i, f in enumerate(fillers):
        order = origin_order(rows, fillers, f).tolist()
        assert sorted(order) == rows.tolist()
        own = list(range(i, 101, n_fillers))
        assert order[: len(own)] == own
        if n_fillers < 2:
            continue
        others = [j for j in range(n_fillers)]
        helped = [r for r in range(101) if r % n_fillers != i and
                  [j for j in others if j != r % n_fillers][(r // n_fillers) % (n_fillers - 1)] == i]  # fmt: skip
        assert order[len(own) : len(own) + len(helped)] == sorted(helped, reverse=True)
        assert order[len(own) + len(helped) :] == sorted(set(range(101)) - set(own) - set(helped), reverse=True)
        for r in helped:
            helpers_of[r].add(f)
    if n_fillers > 1:
        assert all(len(h) == 1 for h in helpers_of.values())  # each row: one owner and one first helper


def test_a_peer_holding_a_row_serves_it_and_the_origin_only_new_rows() -> None:
    plan = SwarmPlan(np.arange(6), 6, "a", origin_order(np.arange(6), ["b", "c"], "c"))
    b_holds = np.array([1, 0, 1, 0, 0, 0], bool)
    b_copying = np.array([0, 0, 0, 0, 1, 0], bool)
    plan.update({"b": PeerView(b_holds, b_copying)})
    picks = []
    while (got := plan.next(lambda _: 1.0)) is not None:
        picks.append(got)
    by_row = {row: sources for row, sources in picks}
    assert by_row[0] == ("b", "a") and by_row[2] == ("b", "a")  # from the peer, the origin as fallback
    assert 4 not in by_row  # the peer is copying it: wait for it rather than pull it from the origin again
    assert {r for r, s in picks if s[0] == "a"} == {1, 3, 5}
    assert plan.remaining == 6
    plan.update({"b": PeerView(b_holds, None)})  # its set went stale: nobody is waited for
    assert plan.next(lambda _: 1.0) == (4, ("a",))
    for row, sources in picks:
        plan.finished(row, sources[0])
    assert plan.remaining == 1 and plan.in_flight["a"] == 1


def test_the_least_loaded_link_per_byte_per_second_gets_the_next_copy() -> None:
    rows = np.arange(20)
    plan = SwarmPlan(rows, 20, "a", rows)
    everything = np.ones(20, bool)
    plan.update({"b": PeerView(everything), "c": PeerView(everything)})
    caps = {"a": 1.0, "b": 3.0, "c": 1.0}
    picks = [plan.next(caps.__getitem__) for _ in range(8)]
    assert Counter(p[1][0] for p in picks if p) == {"b": 6, "c": 2}  # in proportion to the links' limits
    assert all(p[1][-1] == "a" for p in picks if p)  # the origin stays the last resort
    capped = SwarmPlan(rows, 20, "a", rows)
    capped.update({"b": PeerView(rows < 10)})
    got = [capped.next(lambda _: None, per_source=2) for _ in range(5)]
    assert [g[1][0] for g in got if g] == ["b", "a", "b", "a"] and got[4] is None  # alternating: least in flight


def _set(n: int = 13) -> SwarmSet:
    rng = np.random.default_rng(1)
    verified = rng.random(n) < 0.5
    return SwarmSet("v1", "xxh128:ab", verified, ~verified & (rng.random(n) < 0.5), time.time())


def test_the_verified_set_round_trips_and_refuses_what_does_not_match(tmp_path: Path) -> None:
    s = _set()
    back = SwarmSet.from_bytes(s.to_bytes(), version_id="v1", table_digest="xxh128:ab", shards=13)
    assert np.array_equal(back.verified, s.verified) and np.array_equal(back.in_flight, s.in_flight)
    for kw in ({"version_id": "v2"}, {"table_digest": "xxh128:cd"}, {"shards": 14}):
        args = {"version_id": "v1", "table_digest": "xxh128:ab", "shards": 13} | kw
        with pytest.raises(ManifestError):
            SwarmSet.from_bytes(s.to_bytes(), **args)  # type: ignore[arg-type]
    doc = json.loads(s.to_bytes())
    bad = [b"not json", b"[]", json.dumps({**doc, "verified": "!!"}).encode(),
           json.dumps({**doc, "verified": "AAAAAAAA"}).encode(), json.dumps({**doc, "updated_at": "now"}).encode(),
           json.dumps({**doc, "updated_at": True}).encode(), json.dumps({**doc, "format": 2}).encode()]  # fmt: skip
    for data in bad:
        with pytest.raises(ManifestError):
            SwarmSet.from_bytes(data, version_id="v1", table_digest="xxh128:ab", shards=13)
    loc = resolve(str(tmp_path))
    assert read_swarm(loc, "v1", "xxh128:ab", 13) is None
    loc.write_bytes(swarm_path("v1"), s.to_bytes())
    got = read_swarm(loc, "v1", "xxh128:ab", 13)
    assert got is not None and np.array_equal(got.verified, s.verified)
    loc.write_bytes(swarm_path("v1"), s.to_bytes() + b" " * 10_000)  # larger than any set of 13 rows
    assert read_swarm(loc, "v1", "xxh128:ab", 13) is None
    loc.write_bytes(swarm_path("v1"), b"garbage")
    assert read_swarm(loc, "v1", "xxh128:ab", 13) is None


def test_in_flight_rows_already_verified_count_as_verified() -> None:
    doc = json.loads(_set().to_bytes())
    doc["in_flight"] = doc["verified"]
    got = SwarmSet.from_bytes(json.dumps(doc).encode(), version_id="v1", table_digest="xxh128:ab", shards=13)
    assert not (got.in_flight & got.verified).any()


def test_swarm_section_is_off_by_default_and_checked(tmp_path: Path) -> None:
    doc = FerryToml(
        clusters={"a": Cluster(tmp_path / "a"), "b": Cluster(tmp_path / "b")}, rules=[Rule("a", ["b"])]
    ).doc()
    assert not parse_config(doc, base_dir=tmp_path).swarm.enabled
    on = parse_config({**doc, "swarm": {"enabled": True, "interval": 0.5}}, base_dir=tmp_path).swarm
    assert on.enabled and on.interval == 0.5
    for bad, says in (({"enabled": 1}, "swarm.enabled"), ({"interval": 0}, "swarm.interval"),
                      ({"every": 2}, "unknown key")):  # fmt: skip
        with pytest.raises(ConfigError, match=says):
            parse_config({**doc, "swarm": bad}, base_dir=tmp_path)


def test_equally_loaded_sources_go_by_priority() -> None:
    rows = np.arange(4)
    plan = SwarmPlan(rows, 4, "a", rows, priority={"far": 50, "near": 1})
    plan.update({"far": PeerView(np.ones(4, bool)), "near": PeerView(np.ones(4, bool))})
    first = plan.next(lambda _: None)
    assert first is not None and first[1] == ("near", "far", "a")
