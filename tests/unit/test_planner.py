"""Table-driven tests of the pure replication planner (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ferry.service.replication.planner import (
    ShardRef,
    SourceVersion,
    VersionRecord,
    order_sources,
    plan_retention,
    plan_sync,
)
from ferry.shard_tools.storage.store import TEMP_MARKER


def shard(i: int, size: int = 100) -> ShardRef:
    return ShardRef(f"shards/{i:032x}.arrow.zst", size, f"xxh128:{i:032x}")


A, B, C, D = shard(1), shard(2, 200), shard(3, 300), shard(4, 400)
V1 = SourceVersion("v1", [A, B, C])
V2 = SourceVersion("v2", [A, B, C, D])  # a new version appended at the source
TMP = f"shards/{TEMP_MARKER}0123456789ab-{A.path.split('/')[1]}"


def held(*shards: ShardRef, **overrides: int) -> dict[str, int]:
    out = {s.path: s.size for s in shards}
    out.update({k.replace("__", "/"): v for k, v in overrides.items()})
    return out


@dataclass
class Case:
    name: str
    src: SourceVersion
    dest_version: str | None
    listing: dict[str, int] | None
    verified: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)
    copies: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    verifies: list[str] = field(default_factory=list)
    temps: list[str] = field(default_factory=list)
    publish: bool = False
    up_to_date: bool = False


CASES = [
    Case("empty destination", V1, None, {}, copies=[(A.path, "missing"), (B.path, "missing"), (C.path, "missing")]),
    Case(
        "partial destination, verified ones skipped",
        V1,
        None,
        held(A, B),
        verified={A.path, B.path},
        copies=[(C.path, "missing")],
    ),
    Case(
        "present but never verified here: re-hash",
        V1,
        None,
        held(A, B, C),
        verified={A.path},
        verifies=[B.path, C.path],
    ),
    Case(
        "stale temp files are deleted",
        V1,
        None,
        {**held(A, B, C), TMP: 17, f"{TEMP_MARKER}aa-manifest.json": 5},
        verified={A.path, B.path, C.path},
        temps=[f"{TEMP_MARKER}aa-manifest.json", TMP],
        publish=True,
    ),
    Case(
        "corrupt destination shard: wrong size",
        V1,
        None,
        {**held(A, C), B.path: 199},
        verified={A.path, B.path, C.path},
        copies=[(B.path, "size")],
    ),
    Case(
        "corrupt destination shard: known bad digest",
        V1,
        None,
        held(A, B, C),
        verified={A.path, C.path},
        bad={B.path},
        copies=[(B.path, "corrupt")],
    ),
    Case(
        "new version appended at the source: only the new shard",
        V2,
        "v1",
        held(A, B, C),
        verified={A.path, B.path, C.path},
        copies=[(D.path, "missing")],
    ),
    Case(
        "every shard verified: publish now",
        V2,
        "v1",
        held(A, B, C, D),
        verified={s.path for s in V2.shards},
        publish=True,
    ),  # fmt: skip
    Case("up to date: nothing, not even a listing", V1, "v1", None, up_to_date=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan_sync(case: Case) -> None:
    plan = plan_sync(
        case.src, source="src", dest_version=case.dest_version, listing=case.listing, verified=case.verified,
        known_bad=case.bad,
    )  # fmt: skip
    assert plan.up_to_date == case.up_to_date
    assert [(c.shard.path, c.reason) for c in plan.copies] == case.copies
    assert [v.shard.path for v in plan.verifies] == case.verifies
    assert [t.path for t in plan.delete_temps] == case.temps
    assert plan.publish == case.publish
    assert plan.pending_bytes == sum(s.size for s in case.src.shards if s.path in {p for p, _ in case.copies}) + sum(
        s.size for s in case.src.shards if s.path in case.verifies
    )


def test_needs_listing_when_versions_differ() -> None:
    with pytest.raises(ValueError, match="listing"):
        plan_sync(V1, source="src", dest_version=None, listing=None)


@pytest.mark.parametrize(
    ("replicas", "priority", "expected"),
    [
        ({}, {}, ("src",)),
        ({A.path: ["eu"]}, {"eu": 10, "src": 100}, ("eu", "src")),  # nearer replica first
        ({A.path: ["eu"]}, {"eu": 100, "src": 100}, ("src", "eu")),  # tie: the rule's source first
        ({A.path: ["us", "eu"]}, {"eu": 5, "us": 7, "src": 9}, ("eu", "us", "src")),
    ],
)
def test_sources_nearest_first(replicas: dict[str, list[str]], priority: dict[str, int], expected: tuple) -> None:
    plan = plan_sync(SourceVersion("v", [A]), source="src", dest_version=None, listing={}, replicas=replicas,
                     priority=priority)  # fmt: skip
    assert plan.copies[0].sources == expected
    assert order_sources(["b", "a"], {}) == ("a", "b")


def rec(vid: str, t: str, *shards: ShardRef) -> VersionRecord:
    return VersionRecord(vid, t, frozenset(s.path for s in shards), f"tables/{vid}.arrow")


@dataclass
class RCase:
    name: str
    versions: list[VersionRecord]
    current: str
    keep: int
    elsewhere: dict[str, int]
    retire: list[str]
    delete: list[str]
    protected: list[str]
    tables: list[str]


R1, R2, R3 = rec("r1", "2026-01-01", A, B), rec("r2", "2026-01-02", B, C), rec("r3", "2026-01-03", C, D)
RCASES = [
    RCase("within K: nothing", [R1, R2], "r2", 2, {}, [], [], [], []),
    RCase(
        "oldest retired, its own shard deleted (copy elsewhere)",
        [R1, R2, R3],
        "r3",
        2,
        {A.path: 1},
        ["r1"],
        [A.path],
        [],
        ["tables/r1.arrow"],
    ),  # fmt: skip
    RCase(
        "shared shard of a retired version kept",
        [R1, R2, R3],
        "r3",
        2,
        {A.path: 1, B.path: 1},
        ["r1"],
        [A.path],
        [],
        ["tables/r1.arrow"],
    ),  # fmt: skip
    RCase(
        "last verified copy anywhere: protected",
        [R1, R2, R3],
        "r3",
        2,
        {A.path: 0},
        ["r1"],
        [],
        [A.path],
        ["tables/r1.arrow"],
    ),  # fmt: skip
    RCase(
        "keep 1: only current",
        [R1, R2, R3],
        "r3",
        1,
        {A.path: 2, B.path: 1},
        ["r2", "r1"],
        [A.path, B.path],
        [],
        ["tables/r2.arrow", "tables/r1.arrow"],
    ),  # fmt: skip
    RCase(
        "current kept even if older than others",
        [R1, R2, R3],
        "r1",
        1,
        {C.path: 1, D.path: 0},
        ["r3", "r2"],
        [C.path],
        [D.path],
        ["tables/r3.arrow", "tables/r2.arrow"],
    ),  # fmt: skip
    RCase(
        "orphans (earlier last copies) go once copied elsewhere",
        [R2, R3],
        "r3",
        2,
        {A.path: 1, D.path: 0},
        [],
        [A.path],
        [],
        [],
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", RCASES, ids=[c.name for c in RCASES])
def test_plan_retention(case: RCase) -> None:
    orphans = [A.path] if "orphans" in case.name else []
    plan = plan_retention(case.versions, current=case.current, keep_versions=case.keep,
                          copies_elsewhere=case.elsewhere, orphans=orphans)  # fmt: skip
    assert case.current in plan.keep and len(plan.keep) == min(case.keep, len(case.versions))
    assert plan.retire == case.retire
    assert plan.delete_shards == case.delete
    assert plan.protected == case.protected
    assert plan.delete_tables == case.tables
    kept_paths = set().union(*(v.paths for v in case.versions if v.version_id in plan.keep))
    assert not kept_paths & set(plan.delete_shards)  # never delete a shard a kept version needs


def test_retention_rejects_zero() -> None:
    with pytest.raises(ValueError):
        plan_retention([R1], current="r1", keep_versions=0, copies_elsewhere={})


def test_retention_keeps_the_newest_generations_when_their_clocks_agree() -> None:
    """Versions published within one second share ``created_at`` (whole seconds): their place in the lineage,
    not their ids, says which are newest. Here the ids sort against the generations."""
    same = "2026-01-01T00:00:00+00:00"
    old = VersionRecord("ffff", same, frozenset({A.path}), "tables/ffff.arrow", generation=0)
    mid = VersionRecord("eeee", same, frozenset({B.path}), "tables/eeee.arrow", generation=1)
    new = VersionRecord("0000", same, frozenset({C.path}), "tables/0000.arrow", generation=2)
    plan = plan_retention([old, mid, new], current="0000", keep_versions=2, copies_elsewhere={})
    assert plan.keep == ["0000", "eeee"] and plan.retire == ["ffff"]
