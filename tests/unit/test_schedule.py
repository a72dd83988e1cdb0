"""Mixture schedules: per-phase exact proportions, continuity across boundaries, O(1) per position (a scheduled
mixture as a source, resuming inside a phase: tests/integration/test_mixture_sources.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.client.sampling.mixing import MixSchedule
from ferry.client.sampling.schedule import Schedule, quota_of


@st.composite
def schedules(draw: st.DrawFn, max_sources: int = 6) -> Schedule:
    k = draw(st.integers(1, max_sources))
    n = draw(st.integers(1, 4))
    gaps = draw(st.lists(st.integers(1, 300), min_size=n - 1, max_size=n - 1))
    starts = [0, *np.cumsum(gaps).tolist()]
    phases = []
    for s in starts:
        w = draw(st.lists(st.integers(0, 9), min_size=k, max_size=k).filter(lambda x: sum(x) > 0))
        phases.append((s, w))
    return Schedule.from_weights(phases)


@settings(max_examples=120, deadline=None)
@given(sched=schedules(), tail=st.integers(1, 400))
def test_every_prefix_of_a_phase_holds_each_source_within_one_sample(sched: Schedule, tail: int) -> None:
    end = int(sched.starts[-1]) + tail
    src, _ = sched.locate(np.arange(end))
    bounds = [*sched.starts.tolist(), end]
    for k, (start, quota) in enumerate(sched.phases):
        seg = src[start : bounds[k + 1]]
        t = np.arange(1, len(seg) + 1)
        for j, q in enumerate(quota):
            counts = np.cumsum(seg == j)
            assert np.abs(counts - t * q / sum(quota)).max() < 1.0 + 1e-9
            if q == 0:
                assert counts[-1] == 0  # a source left out of a phase is not drawn in it


@settings(max_examples=120, deadline=None)
@given(sched=schedules(), tail=st.integers(1, 400), data=st.data())
def test_each_source_continues_where_it_stopped_and_any_position_is_located_alone(
    sched: Schedule, tail: int, data: st.DataObject
) -> None:
    end = int(sched.starts[-1]) + tail
    src, idx = sched.locate(np.arange(end))
    for j in range(sched.sources):
        # over the whole stream, phase boundaries included, source j reads 0, 1, 2, ... — nothing skipped or repeated
        np.testing.assert_array_equal(idx[src == j], np.arange(int((src == j).sum())))
    p = data.draw(st.integers(0, end - 1))
    s1, i1 = sched.locate(np.asarray([p]))
    assert (int(s1[0]), int(i1[0])) == (int(src[p]), int(idx[p]))  # a pure function of the position
    np.testing.assert_array_equal(sched.drawn(p), np.bincount(src[:p], minlength=sched.sources))


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.floats(0.5, 50.0), min_size=1, max_size=6))
def test_a_single_phase_schedule_is_the_plain_mixture(weights: list[float]) -> None:
    plain = MixSchedule(weights)
    sched = Schedule.from_weights([(0, weights)])
    np.testing.assert_array_equal(sched.quota, plain.quota)
    pos = np.arange(3 * plain.period)
    for a, b in zip(sched.locate(pos), plain.locate(pos), strict=True):
        np.testing.assert_array_equal(a, b)
    assert MixSchedule.from_quota(plain.quota.tolist()).source.tolist() == plain.source.tolist()


def test_far_positions_cost_no_prefix() -> None:
    far = 10**15
    sched = Schedule.from_weights([(0, [1, 1, 0]), (far, [1, 3, 0]), (2 * far, [0, 1, 1])])
    assert sched.drawn(far).tolist() == [far // 2, far // 2, 0]
    assert sched.drawn(2 * far).tolist() == [far // 2 + far // 4, far // 2 + 3 * far // 4, 0]
    src, idx = sched.locate(np.asarray([2 * far, 2 * far + 1]))
    # the first draws of the last phase: the added source starts at 0, the other continues
    assert sorted(zip(src.tolist(), idx.tolist(), strict=True)) == [(1, far // 2 + 3 * far // 4), (2, 0)]


@pytest.mark.parametrize(
    "phases",
    [[], [(1, [1])], [(0, [1]), (0, [1])], [(0, [1, 1]), (5, [1])], [(0, [0, 0])], [(0, [-1, 2])], [(0, [True])]],
)
def test_bad_schedules_are_refused(phases: list) -> None:
    with pytest.raises(ValueError):
        Schedule(phases)


def test_weights_become_exact_quotas() -> None:
    assert quota_of([0, 2, 2]) == (0, 1, 1)
    with pytest.raises(ValueError):
        quota_of([0, 0])


# --- a schedule in the loader ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    from scripts.loader_common import pack_test_dataset

    root = tmp_path_factory.mktemp("sched")
    urls = [pack_test_dataset(str(root / n), d, seed=i) for i, (n, d) in enumerate([("a", 150), ("b", 90), ("c", 60)])]
    return urls, str(root / "cache")


def _rows(loader: object, n: int) -> np.ndarray:
    out: list[np.ndarray] = []
    while len(out) < n:
        for b in loader:  # type: ignore[attr-defined]
            out.extend(b["input_ids"].numpy())
            if len(out) >= n:
                break
    return np.stack(out[:n])


def test_a_scheduled_mixture_reads_each_source_in_its_own_order(three: tuple[list[str], str]) -> None:
    from ferry.client import TokenDataset, TokenLoader

    urls, cache = three
    dss = [TokenDataset(u, seq_len=16, seed=i, cache_dir=cache) for i, u in enumerate(urls)]
    phases = [(0, [1, 1, 0]), (50, [1, 2, 1]), (130, [0, 1, 3])]
    mixed = TokenDataset.mix(dss, weights=phases)
    n = 260
    rows = _rows(TokenLoader(mixed, 5, rank=0, world_size=1), n)
    src, idx = Schedule.from_weights(phases).locate(np.arange(n))
    for j, d in enumerate(dss):
        expect = d.batch(idx[src == j])["input_ids"].numpy() if (src == j).any() else rows[:0]
        np.testing.assert_array_equal(rows[src == j], expect)
