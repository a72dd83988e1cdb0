"""Re-planning on resume: other weights, sources added or removed — every source continues exactly,
the change is recorded, and later resumes on any topology reproduce the whole run."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripts.replan_common import Counting, endless, mix, per_source, run

from ferry.client import TokenDataset, TokenLoader
from ferry.client.resume.state import fingerprint
from ferry.client.stream.mixed import MixedDataset
from ferry.shard_tools.errors import StateError


def weights_for(draw: st.DrawFn, k: int) -> list[int]:
    return draw(st.lists(st.integers(1, 7), min_size=k, max_size=k))


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    old = list(range(draw(st.integers(1, 4))))
    keep = [t for t in old if draw(st.booleans())] or [old[0]]
    added = list(range(10, 10 + draw(st.integers(0, 2))))
    new = keep + added
    if draw(st.booleans()):
        draw_tags = draw(st.permutations(new))
        new = list(draw_tags)
    old_w: Any = weights_for(draw, len(old))
    if draw(st.booleans()):  # a schedule with a later phase
        old_w = [(0, old_w), (draw(st.integers(1, 60)), weights_for(draw, len(old)))]
    return {
        "old": old,
        "old_w": old_w,
        "new": new,
        "new_w": weights_for(draw, len(new)),
        "shape1": (draw(st.integers(1, 3)), draw(st.integers(1, 4))),
        "shape2": (draw(st.integers(1, 3)), draw(st.integers(1, 4))),
        "shape3": (draw(st.integers(1, 3)), draw(st.integers(1, 4))),
        "stop": draw(st.integers(0, 12)),
        "more": draw(st.integers(1, 12)),
    }


@settings(max_examples=60, deadline=None)
@given(p=plans())
def test_a_replanned_run_reads_every_source_exactly_once_in_order_and_resumes_exactly(p: dict[str, Any]) -> None:
    (w1, b1), (w2, b2), (w3, b3) = p["shape1"], p["shape2"], p["shape3"]
    before, state = run(mix(p["old"], p["old_w"]), None, w1, b1, p["stop"])
    reference, _ = run(mix(p["old"], p["old_w"]), None, 1, 1, len(before))
    assert before == reference  # the merged stream before the change is the uninterrupted run's

    new = mix(p["new"], p["new_w"])
    if new.identity() != mix(p["old"], p["old_w"]).identity():  # weights [2, 2] are weights [1, 1]
        with pytest.raises(StateError, match="replan=True"):
            run(new, state, 1, 1, 1)
    after, state2 = run(new, state, w2, b2, p["more"], replan=True)
    # (b) every source, over the whole run, read its own stream from its beginning, nothing repeated or skipped
    for tag, seen in per_source(before + after).items():
        assert seen == list(range(len(seen))), f"source {tag}"
    assert set(per_source(after)) <= set(p["new"])  # a removed source is not read after the change

    # (c) resuming the re-planned run's state (strictly: same configuration) on another topology reproduces it
    tail, _ = run(mix(p["new"], p["new_w"]), state2, w3, b3, 5)
    straight, _ = run(mix(p["new"], p["new_w"]), state, 1, w2 * b2, p["more"] + 0, replan=True)
    assert straight == after  # the re-planned stream does not depend on the topology
    cont, _ = run(mix(p["new"], p["new_w"]), state, 1, 1, len(after) + len(tail), replan=True)
    assert cont == after + tail
    again, _ = run(mix(p["new"], p["new_w"]), state2, w3, b3, 5, replan=True)
    assert again == tail  # replan=True with an unchanged mixture changes nothing


def test_the_change_is_a_phase_in_the_state_and_a_third_plan_keeps_the_whole_history() -> None:
    _, s1 = run(mix([0, 1], [1, 1]), None, 2, 3, 4)  # 24 samples: 12 of each
    assert s1["version"] == 2 and s1["plan"]["phases"] == [[0, [1, 1]]] and s1["position"] == 24
    got2, s2 = run(mix([1, 2], [3, 1]), s1, 1, 4, 2, replan=True)  # source 0 removed, 2 added
    plan = s2["plan"]
    assert [json.loads(s[2])["dataset_version"] for s in plan["sources"]] == ["src0", "src1", "src2"]
    assert plan["phases"] == [[0, [1, 1, 0]], [24, [0, 3, 1]]] and plan["anchor"] == 24
    assert per_source(got2) == {1: list(range(12, 18)), 2: [0, 1]}
    got3, s3 = run(mix([0, 2], [1, 1]), s2, 3, 1, 4, replan=True)  # source 0 comes back where it stopped
    assert s3["plan"]["phases"] == [[0, [1, 1, 0]], [24, [0, 3, 1]], [32, [1, 0, 1]]]
    assert per_source(got3) == {0: list(range(12, 18)), 2: list(range(2, 8))}


def test_without_replan_a_differing_mixture_is_an_error_naming_what_differs() -> None:
    _, state = run(mix([0, 1], [1, 1]), None, 1, 2, 2)
    with pytest.raises(StateError, match=r"weights .* differ.*replan=True"):
        run(mix([0, 1], [1, 3]), state, 1, 2, 1)
    with pytest.raises(StateError, match=r"sources added: 'src5'.*replan=True"):
        run(mix([0, 1, 5], [1, 1, 1]), state, 1, 2, 1)
    with pytest.raises(StateError, match=r"sources removed: 'src1'"):
        run(mix([0], [1]), state, 1, 2, 1)
    with pytest.raises(StateError, match="seq_len"):
        run(TokenDataset.mix([Counting(0, seq_len=4)], [1]), state, 1, 2, 1, replan=True)
    # a plan whose tail is not the mixture its fingerprint names is refused
    bad = {**state, "plan": {**state["plan"], "phases": [[0, [2, 1]]]}}
    with pytest.raises(StateError, match="corrupt"):
        run(mix([0, 1], [1, 1]), bad, 1, 2, 1)


def test_a_version_1_state_of_a_mixture_still_loads_and_cannot_be_replanned() -> None:
    ds = mix([0, 1], [2, 1])
    ident = ds.identity()
    v1 = {"version": 1, "dataset_version": ident["dataset_version"], "seed": ident["seed"], "seq_len": 3,
          "epoch": 0, "consumed": 9, "fingerprint": fingerprint(ident)}  # fmt: skip
    got, _ = run(ds, v1, 1, 3, 2)
    ref, _ = run(mix([0, 1], [2, 1]), None, 1, 15, 1)
    assert got == ref[9:]
    with pytest.raises(StateError, match="without plans"):
        run(mix([0, 1], [1, 1]), v1, 1, 3, 1, replan=True)


def test_a_single_dataset_run_can_gain_a_source() -> None:
    a = Counting(0)
    _, state = run(a, None, 1, 5, 2)
    assert state["version"] == 1
    got, s2 = run(TokenDataset.mix([Counting(0), Counting(3)], [1, 1]), state, 2, 2, 3, replan=True)
    assert per_source(got) == {0: list(range(10, 16)), 3: list(range(6))}
    assert s2["plan"]["phases"] == [[0, [1, 0]], [10, [1, 1]]]


# --- real datasets ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    from scripts.loader_common import pack_test_dataset

    root = tmp_path_factory.mktemp("replan")
    return [pack_test_dataset(str(root / f"d{i}"), 80 + 30 * i, seed=i) for i in range(3)], str(root / "cache")


def test_real_datasets_continue_exactly_after_reweighting_and_a_new_source(urls: tuple[list[str], str]) -> None:
    paths, cache = urls

    def ds(i: int) -> TokenDataset:
        return TokenDataset(paths[i], seq_len=16, seed=i, cache_dir=cache, shuffle="window" if i else "global")

    first = TokenLoader(TokenDataset.mix([ds(0), ds(1)], [1, 1]), 4, rank=0, world_size=1)
    rows: list[np.ndarray] = []
    for b in first:
        rows.extend(b["input_ids"].numpy())
        if len(rows) >= 40:
            break
    state = first.state_dict()
    mixed = TokenDataset.mix([ds(0), ds(1), ds(2)], [1, 3, 2])
    second = TokenLoader(mixed, 6, rank=0, world_size=1)
    second.load_state_dict(state, replan=True)
    for b in second:
        rows.extend(b["input_ids"].numpy())
        if len(rows) >= 100:
            break
    src, idx = second.dataset.schedule.locate(np.arange(len(rows)))  # type: ignore[attr-defined]
    got = np.stack(rows)
    for j in range(3):
        # source j's rows, in delivery order, are its own stream from the start
        n = int((src == j).sum())
        np.testing.assert_array_equal(got[src == j], ds(j).batch(np.arange(n))["input_ids"].numpy())
        assert idx[src == j].tolist() == list(range(n))


# --- continuing on a newer version (pack --append) ------------------------------------------------------------


@pytest.mark.parametrize("shuffle", ["global", "window"])
def test_a_run_continues_on_an_appended_version_epoch_by_epoch(tmp_path: Any, shuffle: str) -> None:
    from scripts.loader_common import make_documents, pack_test_dataset

    from ferry.shard_tools.packer.packing import PackOptions, pack_documents

    url = pack_test_dataset(str(tmp_path / "d"), 60, seed=1, shard_size=2048)
    cache = str(tmp_path / "cache")

    def open_(version: str | None = None) -> TokenDataset:
        return TokenDataset(url, seq_len=16, seed=4, cache_dir=cache, shuffle=shuffle, window=2, version=version)

    old = open_()
    n_old = old.num_samples
    first = TokenLoader(old, 5, rank=0, world_size=1)
    head = run_rows(first, (n_old + n_old // 2) // 5)  # into epoch 1
    state = first.state_dict()
    pos = state["epoch"] * n_old + state["consumed"]
    assert state["epoch"] == 1

    opts = PackOptions(vocab_size=1000, eos_id=0, shard_size=2048, progress=False, append=True)
    pack_documents(make_documents(40, seed=9), url, opts)
    new = open_()
    n_new = new.num_samples
    assert n_new > n_old
    with pytest.raises(StateError, match="dataset_version.*replan=True"):
        TokenLoader(new, 5, rank=0, world_size=1).load_state_dict(state)
    cont = TokenLoader(new, 4, rank=0, world_size=1)
    cont.load_state_dict(state, replan=True)
    assert cont.position == pos and cont.epoch == 1
    rest = 2 * n_old - pos
    tail = run_rows(cont, -(-(rest + 2 * n_new) // 4))
    # epoch 1 finishes over the old samples in the old order ...
    expect_old = old.batch(np.arange(pos, 2 * n_old))["input_ids"].numpy()
    np.testing.assert_array_equal(tail[:rest], expect_old)
    # ... and epochs 2 and 3 are epochs of the new version (every sample once, the appended ones included)
    for e in (2, 3):
        ids = new.order.sample_ids(e, np.arange(n_new))
        assert sorted(ids.tolist()) == list(range(n_new))
        got = tail[rest + (e - 2) * n_new : rest + (e - 1) * n_new]
        np.testing.assert_array_equal(got, _rows_of(new, ids))
    state2 = cont.state_dict()
    assert state2["eras"] == [[old.version_id, n_old, len(old.manifest.shards), 2]]
    # a later resume (strict, other shape) reproduces the continued run
    again = TokenLoader(open_(), 2, rank=0, world_size=1)
    half = TokenLoader(new, 4, rank=0, world_size=1)
    half.load_state_dict(state, replan=True)
    mid = run_rows(half, 10)
    again.load_state_dict(half.state_dict())
    np.testing.assert_array_equal(np.concatenate([mid, run_rows(again, 20)]), tail[:80])
    assert head.shape[0] == pos


def run_rows(loader: TokenLoader, batches: int) -> np.ndarray:
    out: list[np.ndarray] = []
    it = endless(loader)
    for _ in range(batches):
        out.extend(next(it)["input_ids"].numpy())
    del it
    return np.stack(out)


def _rows_of(ds: TokenDataset, ids: np.ndarray) -> np.ndarray:
    """Rows of sample ids (not positions) of ``ds``, read through an unshuffled twin."""
    plain = TokenDataset(ds.url or "", seq_len=ds.seq_len, shuffle="none", cache_dir=ds.cache.directory)
    return plain.batch(ids)["input_ids"].numpy()


def test_a_mixture_source_continues_on_its_appended_version(tmp_path: Any) -> None:
    from scripts.loader_common import make_documents, pack_test_dataset

    from ferry.shard_tools.packer.packing import PackOptions, pack_documents

    urls = [pack_test_dataset(str(tmp_path / n), 40, seed=i, shard_size=2048) for i, n in enumerate("ab")]
    cache = str(tmp_path / "cache")

    def mixture() -> tuple[MixedDataset, list[TokenDataset]]:
        dss = [
            TokenDataset(u, seq_len=16, seed=i, cache_dir=cache, shuffle="window", window=2) for i, u in enumerate(urls)
        ]
        return TokenDataset.mix(dss, [3, 1]), dss

    old_mix, old = mixture()
    n_a = old[0].num_samples
    first = TokenLoader(old_mix, 4, rank=0, world_size=1)
    rows = run_rows(first, n_a // 3)  # source a is most of the way through its epoch 0
    state = first.state_dict()
    drawn_a = int(old_mix.schedule.drawn(first.position)[0])
    assert 0 < drawn_a < n_a

    pack_documents(
        make_documents(30, seed=7),
        urls[0],
        PackOptions(vocab_size=1000, eos_id=0, shard_size=2048, progress=False, append=True),
    )
    new_mix, new = mixture()
    cont = TokenLoader(new_mix, 4, rank=0, world_size=1)
    cont.load_state_dict(state, replan=True)
    total = -(-(n_a - drawn_a + 2 * new[0].num_samples) * 4 // 3 // 4) + 4
    rows = np.concatenate([rows, run_rows(cont, total)])
    src, _ = cont.dataset.schedule.locate(np.arange(len(rows)))  # type: ignore[attr-defined]
    got_a = rows[src == 0]
    # source a: the old version's epoch 0 to its end, then the new version's epochs
    np.testing.assert_array_equal(got_a[:n_a], old[0].batch(np.arange(n_a))["input_ids"].numpy())
    e1 = got_a[n_a : n_a + new[0].num_samples]
    ids = new[0].order.sample_ids(1, np.arange(len(e1)))
    plain = TokenDataset(urls[0], seq_len=16, shuffle="none", cache_dir=cache)
    np.testing.assert_array_equal(e1, plain.batch(ids)["input_ids"].numpy())
    # source b: untouched, its own stream
    got_b = rows[src == 1]
    np.testing.assert_array_equal(got_b, new[1].batch(np.arange(len(got_b)))["input_ids"].numpy())
    # and a later strict resume reproduces it
    state2 = cont.state_dict()
    assert state2["plan"]["sources"][0][3] == [[old[0].version_id, n_a, len(old[0].manifest.shards), 1]]
    again = TokenLoader(mixture()[0], 2, rank=0, world_size=1)
    again.load_state_dict(state2)
    assert again.dataset.schedule == cont.dataset.schedule  # type: ignore[attr-defined]
