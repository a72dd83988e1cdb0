"""Ancestry through lineages: answered after ``versions/`` was pruned, in a bounded number of reads."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from ferry.shard_tools.errors import ManifestError
from ferry.shard_tools.format.header import version_path
from ferry.shard_tools.format.manifest import Manifest, ShardTable, Tokenizer, lineage_of, next_lineage
from ferry.shard_tools.storage.publish import carry_lineage, descends_from, lineage_path, store_version
from ferry.shard_tools.storage.store import Location, resolve

_names = itertools.count()


class CountingLocation(Location):
    """A Location that counts the objects it reads."""

    reads = 0

    def read_bytes(self, rel: str) -> bytes:
        self.reads += 1
        return super().read_bytes(rel)


def location() -> CountingLocation:
    loc = resolve(f"memory://lineage-{next(_names)}")
    return CountingLocation(loc.fs, loc.root, loc.url)


_TABLE = ShardTable.empty()


def chain(loc: Location, n: int, *, parent: Manifest | None = None, lineage: bool = True, tag: str = "") -> list[str]:
    """Publish ``n`` versions in a line (each stored as a pack stores it); returns their ids, oldest first."""
    ids = []
    for i in range(n):
        m, table = Manifest.build(
            name=f"ds{tag}", token_dtype="uint16", tokenizer=Tokenizer("t", 1000, 999), eos_appended=True,
            shards=_TABLE, parent=parent.version_id if parent else None, created_at=f"2026-01-01T00:00:{i}",
            tool_version="test", lineage=(parent.child_lineage() if lineage else None) if parent else None,
        )  # fmt: skip
        store_version(loc, m, table)
        ids.append(m.version_id)
        parent = m
    return ids


def prune(loc: Location, keep: set[str]) -> None:
    """What retention does: delete versions/ except ``keep`` (lineage/ stays)."""
    for name in loc.listdir("versions"):
        if name[: -len(".json")] not in keep:
            loc.remove(f"versions/{name}")


def test_lineage_entries_are_logarithmic() -> None:
    lin: dict[str, Any] | None = None
    parent = "v0"
    for g in range(1, 5000):
        lin = next_lineage(parent, lin)
        assert lin["gen"] == g and lin["up"][0] == [g - 1, parent] and lin["up"][-1] == [0, "v0"]
        assert len(lin["up"]) <= (g - 1).bit_length() + 1
        parent = f"v{g}"
    assert lin is not None and len(json.dumps(lin)) < 64 * 20


def test_ancestry_at_thousands_of_versions_reads_a_bounded_number_of_headers() -> None:
    loc = location()
    ids = chain(loc, 3000)
    prune(loc, {ids[-1], ids[-2]})
    tip = ids[-1]
    worst = 0
    for k in (0, 1, 2, 999, 1024, 1500, 2047, 2048, 2500, 2997, 2998):
        loc.reads = 0
        ok, why = descends_from([loc], tip, ids[k])
        assert ok, (k, why)
        worst = max(worst, loc.reads)
        assert loc.reads <= 2 + (2999 - k).bit_length() + 1, (k, loc.reads)
    assert worst <= 15
    # a genuine rollback (an older version does not descend from a newer one) is refused, cheaply
    loc.reads = 0
    ok, why = descends_from([loc], ids[1200], tip)
    assert not ok and "not an ancestor" in why and loc.reads <= 3


def test_a_branch_is_not_an_ancestor() -> None:
    loc = location()
    ids = chain(loc, 1800)
    base = Manifest.from_json(loc.read_bytes(version_path(ids[1500])), loc.read_bytes(_TABLE_PATH(loc, ids[1500])))
    branch = chain(loc, 10, parent=base, tag="-branch")
    prune(loc, set())
    for a, b in ((branch[-1], ids[1600]), (ids[-1], branch[3]), (branch[-1], ids[-1])):
        loc.reads = 0
        ok, _ = descends_from([loc], a, b)
        assert not ok and loc.reads <= 16, (a, b, loc.reads)
    assert descends_from([loc], branch[-1], ids[1500])[0]
    assert descends_from([loc], branch[-1], ids[700])[0]


def _TABLE_PATH(loc: Location, vid: str) -> str:  # noqa: N802 - a helper named like the constant it reads
    return str(json.loads(loc.read_bytes(version_path(vid)))["shard_table"]["path"])


def test_versions_written_without_lineage_use_the_parent_chain() -> None:
    loc = location()
    old = chain(loc, 6, lineage=False)
    tip = Manifest.from_json(loc.read_bytes(version_path(old[-1])), loc.read_bytes(_TABLE_PATH(loc, old[-1])))
    new = chain(loc, 40, parent=tip)
    first = lineage_of(json.loads(loc.read_bytes(version_path(new[0]))))
    assert first is not None and first["root"] == old[-1] and first["gen"] == 1
    assert descends_from([loc], new[-1], old[2])[0]  # across the boundary, through versions/ below it
    assert descends_from([loc], new[-1], new[3])[0]
    for vid in old[:-1]:  # an old dataset's pruned chain: nothing to follow below the root
        loc.remove(version_path(vid))
        loc.remove(lineage_path(vid))
    ok, why = descends_from([loc], new[-1], old[1])
    assert not ok and "missing" in why
    assert descends_from([loc], new[-1], old[-1])[0]  # the root itself is named in every lineage


def test_a_hand_edited_lineage_is_not_believed() -> None:
    loc = location()
    ids = chain(loc, 20)
    other = chain(loc, 3, tag="-other")
    doc = json.loads(loc.read_bytes(lineage_path(ids[-1])))
    doc["lineage"]["up"][-1] = [0, other[0]]
    doc["lineage"]["root"] = other[0]
    loc.write_bytes(lineage_path(ids[-1]), json.dumps(doc).encode())
    loc.write_bytes(version_path(ids[-1]), json.dumps(doc).encode())
    ok, why = descends_from([loc], ids[-1], other[0])
    assert not ok and "missing" in why
    with pytest.raises(ManifestError):
        lineage_of({**doc, "lineage": {"gen": 5, "root": "r", "up": [[1, "x"]]}})


def test_carry_lineage_copies_only_the_versions_between() -> None:
    src, dst = location(), location()
    ids = chain(src, 50)
    store_version(dst, *_load(src, ids[9]))
    store_version(dst, *_load(src, ids[-1]))
    assert carry_lineage([src], dst, ids[-1], ids[9]) == 50 - 10 - 1
    assert carry_lineage([src], dst, ids[-1], ids[9]) == 0
    prune(dst, set())
    assert descends_from([dst], ids[-1], ids[9])[0]  # the destination alone answers
    assert carry_lineage([src], dst, ids[-1], None) == 0  # a first sync: nothing older to connect to


def _load(loc: Location, vid: str) -> tuple[Manifest, bytes]:
    table = loc.read_bytes(_TABLE_PATH(loc, vid))
    return Manifest.from_json(loc.read_bytes(version_path(vid)), table), table


def test_a_record_under_another_versions_name_is_not_believed() -> None:
    loc = location()
    ids = chain(loc, 30)
    other = chain(loc, 2, tag="-other")
    prune(loc, set())
    # lineage/<ids[20]>.json replaced by a valid header of another version: ignored, so the walk
    # through it fails instead of taking the other version's ancestry
    loc.write_bytes(lineage_path(ids[20]), loc.read_bytes(lineage_path(other[1])))
    ok, why = descends_from([loc], ids[20], other[0])
    assert not ok and "missing" in why
    huge = {"gen": 10**6, "root": "r", "up": [[10**6 - 1 - i, f"v{i}"] for i in range(65)]}
    with pytest.raises(ManifestError):
        lineage_of({"version_id": "x", "parent": "v0", "lineage": huge})
