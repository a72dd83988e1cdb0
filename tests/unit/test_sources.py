"""Pure planning: format detection, Megatron unit ranges, shard cuts (property tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.shard_tools import UsageError
from ferry.shard_tools.format.megatron import write_megatron
from ferry.shard_tools.packer.packunit import cut_shards, with_eos
from ferry.shard_tools.sources import DocBatch, SourceOptions, detect_format, plan_units
from ferry.shard_tools.sources.megatron import plan_megatron


@pytest.mark.parametrize(
    "path, fmt",
    [
        ("a.parquet", "parquet"),
        ("s3://b/x.JSONL.ZST", "jsonl"),
        ("x.json.gz", "jsonl"),
        ("notes.txt.gz", "text"),
        ("README.md", "text"),
        ("t.npy", "npy"),
        ("m.idx", "megatron"),
        ("m.bin", "megatron"),
    ],
)
def test_detect_format(path: str, fmt: str) -> None:
    assert detect_format(path) == fmt


def test_detect_format_errors() -> None:
    with pytest.raises(UsageError, match="--input-format"):
        detect_format("data.csv")
    with pytest.raises(UsageError, match="unknown input format"):
        detect_format("data.csv", "csv")
    assert detect_format("data.csv", "text") == "text"


def batch(lengths: list[int]) -> DocBatch:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return DocBatch(np.arange(int(offsets[-1]), dtype=np.int64) % 1000, offsets)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 300), max_size=30), max_size=8),
    st.integers(16, 4000),
    st.sampled_from([2, 4]),
)
def test_cut_shards_properties(batches: list[list[int]], budget: int, itemsize: int) -> None:
    parts = [batch(b) for b in batches]
    shards = list(cut_shards(iter(parts), budget, itemsize))
    # nothing lost, reordered or split: the documents come back in order
    lengths_in = [n for b in batches for n in b]
    lengths_out = [int(n) for s in shards for n in np.diff(s.offsets)]
    assert lengths_out == lengths_in
    flat_in = np.concatenate([p.tokens for p in parts]) if parts else np.zeros(0)
    flat_out = np.concatenate([s.tokens for s in shards]) if shards else np.zeros(0)
    assert np.array_equal(flat_in, flat_out)
    for i, s in enumerate(shards):
        size = int(s.offsets[-1]) * itemsize + 4 * (len(s.offsets) - 1)
        last_doc = int(s.offsets[-1] - s.offsets[-2]) * itemsize + 4 if len(s.offsets) > 1 else 0
        assert len(s.offsets) > 1  # never an empty shard
        assert size - last_doc < budget  # cut at the first boundary reaching the budget...
        if i < len(shards) - 1:
            assert size >= budget  # ...and not before it
    # regrouping the input batches differently never changes the cuts
    merged = [batch(lengths_in)] if lengths_in else []
    again = list(cut_shards(iter(merged), budget, itemsize))
    assert [s.offsets.tolist() for s in again] == [s.offsets.tolist() for s in shards]


@given(st.lists(st.lists(st.integers(0, 65534), max_size=20), min_size=1, max_size=20))
def test_with_eos(docs: list[list[int]]) -> None:
    b = batch([len(d) for d in docs])
    b = DocBatch(np.array([t for d in docs for t in d], dtype=np.int64), b.offsets)
    out = with_eos(b, 65535, "uint16")
    assert out.tokens.dtype == np.uint16
    got = [out.tokens[out.offsets[i] : out.offsets[i + 1]].tolist() for i in range(len(docs))]
    assert got == [d + [65535] for d in docs]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=0, max_size=200), st.integers(1024, 20_000))
def test_plan_megatron_covers_every_sequence_once(tmp_path_factory: pytest.TempPathFactory, lengths: list[int],
                                                   shard_size: int) -> None:  # fmt: skip
    prefix = str(tmp_path_factory.mktemp("mg") / "c")
    write_megatron(prefix, [np.zeros(n, dtype=np.uint16) for n in lengths], np.dtype(np.uint16))
    units = plan_megatron(prefix, SourceOptions(shard_size=shard_size))
    assert units[0].start == 0 and units[-1].stop == len(lengths)
    for a, b in zip(units, units[1:], strict=False):
        assert a.stop == b.start and a.stop > a.start
    assert units == plan_megatron(prefix, SourceOptions(shard_size=shard_size))  # pure: same plan every time


def test_plan_units_orders_and_dedups(tmp_path: Path) -> None:
    for name in ("b.npy", "a.npy"):
        np.save(tmp_path / name, np.arange(3))
    write_megatron(str(tmp_path / "m"), [np.arange(4)], np.dtype(np.uint16))
    paths = [str(tmp_path / "b.npy"), str(tmp_path / "m.bin"), str(tmp_path / "a.npy"), str(tmp_path / "m.idx")]
    units = plan_units(paths, SourceOptions())
    assert [(Path(u.path).name, u.format) for u in units] == [("b.npy", "npy"), ("m", "megatron"), ("a.npy", "npy")]
    with pytest.raises(UsageError, match="no input files"):
        plan_units([], SourceOptions())


@pytest.mark.parametrize("vocab, eos", [(1000, True), (100_000, True), (100_000, False)])
def test_megatron_units_pack_into_full_shards(tmp_path: Path, vocab: int, eos: bool) -> None:
    from ferry.shard_tools import PackOptions, open_dataset, pack

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 999, size=int(n)) for n in rng.integers(1, 300, size=1500)]
    write_megatron(str(tmp_path / "m"), docs, np.dtype(np.int32))
    budget = 32 * 1024
    pack([str(tmp_path / "m.bin")], str(tmp_path / "ds"),
         PackOptions(vocab_size=vocab, eos_id=999, shard_size=budget, append_eos=eos))  # fmt: skip
    t = open_dataset(str(tmp_path / "ds")).manifest.shards
    itemsize = 2 if vocab <= 65536 else 4
    counted = t.tokens * itemsize + 4 * t.documents  # what the cutter counts
    assert len(t) > 5 and (counted[:-1] >= budget).all()  # no half-empty or remainder shards
    assert (counted[:-1] - budget < 300 * itemsize + 8).all()  # overshoot at most one document
