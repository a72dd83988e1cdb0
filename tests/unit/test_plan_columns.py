"""The planner on columns: Arrow/numpy conversions without pandas, and a plan of many rows by row numbers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ferry.service.replication.columns import EMPTY_STRINGS, bools, int64s, positions, strings
from ferry.service.replication.planner import MISSING, REASONS, SourceColumns, SourcePicker, plan_columns
from ferry.shard_tools.format.manifest import digest_column


def test_columns_convert_both_ways_with_nulls_and_slices() -> None:
    column = strings(["shards/a", "é/ß", "", "x" * 300])
    assert column.to_pylist() == ["shards/a", "é/ß", "", "x" * 300] and column.type == pa.string()
    assert len(EMPTY_STRINGS) == 0 and int64s(np.array([3, -1])).to_pylist() == [3, -1]
    flags = pa.chunked_array([[True, None, False, True, True, False, None, True, True, False]]).combine_chunks()
    assert bools(flags).tolist() == [True, False, False, True, True, False, False, True, True, False]
    assert bools(flags.slice(3, 6)).tolist() == [True, True, False, False, True, True]  # an offset inside a byte
    at = pc.index_in(strings(["b", "z", "a", "b", "q"]), value_set=strings(["a", "b"]))
    assert positions(at).tolist() == [1, -1, 0, 1, -1] and positions(at.slice(1, 3)).tolist() == [-1, 0, 1]


def test_a_plan_of_many_rows_is_row_numbers() -> None:
    n = 50_000
    rng = np.random.default_rng(3)
    paths = strings(f"shards/{i:032x}.arrow.zst" for i in range(n))
    sizes = rng.integers(1, 1000, n, dtype=np.int64)
    cols = SourceColumns("v2", paths, sizes, digest_column(strings(f"xxh128:{i:032x}" for i in range(n))))
    held = np.where(rng.random(n) < 0.7, sizes, MISSING)
    wrong = rng.random(n) < 0.05
    held[wrong & (held != MISSING)] += 1
    verified = rng.random(n) < 0.5
    bad = rng.random(n) < 0.02
    plan = plan_columns(cols, dest_version="v1", held_sizes=held, verified=verified, bad=bad)
    missing, sized = held == MISSING, (held != MISSING) & (held != sizes)
    corrupt = ~missing & ~sized & bad
    copy = missing | sized | corrupt
    assert plan.copy_rows.tolist() == np.flatnonzero(copy).tolist()
    reasons = [REASONS[r] for r in plan.copy_reasons.tolist()]
    assert reasons.count("missing") == missing.sum() and reasons.count("size") == sized.sum()
    assert reasons.count("corrupt") == corrupt.sum()
    assert plan.verified_rows.tolist() == np.flatnonzero(~copy & verified).tolist()
    assert plan.verify_rows.tolist() == np.flatnonzero(~copy & ~verified).tolist()
    assert not plan.publish and not plan.up_to_date
    assert len(plan_columns(cols, dest_version="v2", held_sizes=None).verified_rows) == n
    picked = cols.refs(plan.copy_rows[:3])
    assert [r.path for r in picked] == [f"shards/{i:032x}.arrow.zst" for i in plan.copy_rows[:3].tolist()]


def test_sources_of_a_row_are_its_holders_nearest_first() -> None:
    holders = {"eu": np.array([True, False, True]), "us": np.array([True, True, False])}
    pick = SourcePicker("src", {"eu": 5, "us": 7, "src": 9}, holders)
    assert [pick(i) for i in range(3)] == [("eu", "us", "src"), ("us", "src"), ("eu", "src")]
    assert SourcePicker("src")(0) == ("src",)
