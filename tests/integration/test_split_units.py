"""Large single inputs split into sub-units: the same documents as the whole file, the same bytes
for any number of workers, Ray, and ``--part``/``--merge``; boundaries at awkward places."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from parquet_corpus import shard_bytes

import ferry.shard_tools.sources.split as split
from ferry.shard_tools import InputFormatError, PackOptions, TokenRangeError, open_dataset, pack
from ferry.shard_tools.packer.packing import merge_parts, pack_part
from ferry.shard_tools.sources import SourceOptions, Unit, plan_units, read_unit
from ferry.shard_tools.sources.split import even_cuts, group_runs, zstd_frames
from ferry.shard_tools.sources.tokenizer import ByteTokenizer

VOCAB = 1000
SHARD = 1024  # the smallest --shard-size: many shards per sub-unit
OPTS = PackOptions(vocab_size=VOCAB, eos_id=VOCAB - 1, shard_size=SHARD, name="split")
WHOLE = 10**15  # a split size no test file reaches


@pytest.fixture
def small_splits(monkeypatch: pytest.MonkeyPatch) -> int:
    """Cut test-sized files: sub-units of 8 shards (8 KiB raw, 16 KiB of JSON) instead of at least 64 MiB."""
    monkeypatch.setattr(split, "MIN_SPLIT_BYTES", 0)
    return split.SPLIT_SHARDS * SHARD


def token_lines(n: int, seed: int = 0, *, sep: str = "\n", blank_every: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append(json.dumps({"tokens": rng.integers(0, VOCAB - 1, int(rng.integers(0, 60))).tolist()}))
        if blank_every and i % blank_every == 0:
            out.append("   " if i % 2 else "")
    return out


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def docs_of(units: list[Unit], options: SourceOptions) -> list[list[int]]:
    out: list[list[int]] = []
    for unit in units:
        for b in read_unit(unit, options):
            out += [b.tokens[b.offsets[i] : b.offsets[i + 1]].tolist() for i in range(len(b.offsets) - 1)]
    return out


def split_and_whole(path: str, options: SourceOptions) -> tuple[list[Unit], list[list[int]], list[list[int]]]:
    units = plan_units([path], options)
    whole = plan_units([path], replace(options, split_size=WHOLE))
    assert len(whole) == 1 and whole[0].stop is None
    return units, docs_of(units, options), docs_of(whole, options)


def read_back(url: str) -> list[list[int]]:
    return [d.tolist() for d in open_dataset(url).documents()]


# --- the plan: pure arithmetic --------------------------------------------------------------


@given(st.integers(0, 10**7), st.integers(10**4, 10**6))  # at most 1000 pieces
def test_even_cuts_are_increasing_pieces_of_at_least_one_split(size: int, split_size: int) -> None:
    cuts = even_cuts(size, split_size)
    bounds = [0, *cuts, size]
    assert len(cuts) == (size // split_size - 1 if size >= 2 * split_size else 0)
    if cuts:
        assert all(b - a >= split_size for a, b in zip(bounds, bounds[1:], strict=False))


@given(st.lists(st.integers(0, 5000), max_size=60), st.integers(1, 20000))
def test_group_runs_cover_every_item_once_in_order(sizes: list[int], split_size: int) -> None:
    runs = group_runs(sizes, split_size)
    assert runs[0][0] == 0 and runs[-1][1] == len(sizes)
    assert all(a < b for a, b in runs) or sizes == []
    assert all(runs[i][1] == runs[i + 1][0] for i in range(len(runs) - 1))
    assert len(runs) <= max(1, sum(sizes) // split_size)


# --- JSON Lines and text byte ranges --------------------------------------------------------


@pytest.mark.parametrize("sep", ["\n", "\r\n"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_jsonl_ranges_start_at_lines_and_read_the_same_documents(tmp_path: Path, sep: str, final_newline: bool) -> None:
    data = sep.join(token_lines(2500, sep=sep, blank_every=37)).encode() + (sep.encode() if final_newline else b"")
    path = write(tmp_path / "a.jsonl", data)
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD)
    units, parts, whole = split_and_whole(path, options)
    assert len(units) > 10 and all(u.span == "bytes" for u in units)
    assert units[0].start == 0 and units[-1].stop == len(data)
    for a, b in zip(units, units[1:], strict=False):
        assert a.stop == b.start and data[b.start - 1 : b.start] == b"\n"
    assert parts == whole and len(whole) == 2500


def test_a_cut_inside_a_very_long_line_moves_past_it_or_is_dropped(tmp_path: Path) -> None:
    split_size = 8 * SHARD
    short = token_lines(400, seed=1)
    long_line = json.dumps({"tokens": list(range(VOCAB - 1)) * 12})  # ~50 KB: spans several nominal cuts
    lines = [*short[:150], long_line, *short[150:]]
    data = ("\n".join(lines) + "\n").encode()
    path = write(tmp_path / "long.jsonl", data)
    options = SourceOptions(shard_size=SHARD, split_size=split_size)
    units, parts, whole = split_and_whole(path, options)
    start = data.index(long_line.encode())
    end = start + len(long_line) + 1
    nominal = even_cuts(len(data), split_size)
    inside = [c for c in nominal if start < c < end]
    assert len(inside) >= 3  # the line really covers nominal cuts
    assert not any(start < u.start < end for u in units)  # no unit starts inside it
    assert any(u.start == end for u in units)  # the last cut inside it moved to just after it
    assert len(units) < len(nominal) + 1  # the others were dropped
    assert parts == whole


def test_text_lines_split_with_crlf_lone_cr_and_empty_lines(tmp_path: Path) -> None:
    pieces = []
    for i in range(3000):
        pieces.append(f"line {i} ✓".encode() + (b"\r\n", b"\n", b"\r", b"\n\n")[i % 4])
    data = b"".join(pieces) + b"no final newline"
    path = write(tmp_path / "t.txt", data)
    options = SourceOptions(tokenizer=ByteTokenizer(), text_per_line=True, shard_size=SHARD, split_size=8 * SHARD)
    units, parts, whole = split_and_whole(path, options)
    assert len(units) > 3
    assert parts == whole and whole[-1] == list(b"no final newline")
    # one document per text file is never cut
    assert len(plan_units([path], replace(options, text_per_line=False))) == 1


def test_a_file_just_above_the_threshold_is_cut_in_two(tmp_path: Path) -> None:
    split_size = 8 * SHARD
    line = b'{"tokens": [1, 2, 3]}'.ljust(31) + b"\n"  # 32 bytes: a nominal cut falls on a line start
    body = line * (2 * split_size // len(line))
    options = SourceOptions(shard_size=SHARD, split_size=split_size)
    below = write(tmp_path / "below.jsonl", body[:-1])  # no final newline
    exact = write(tmp_path / "exact.jsonl", body)
    assert [u.stop for u in plan_units([below], options)] == [None]
    two = plan_units([exact], options)
    assert [(u.start, u.stop) for u in two] == [(0, split_size), (split_size, 2 * split_size)]
    assert docs_of(two, options) == docs_of(plan_units([below], options), options) == [[1, 2, 3]] * 512


def test_gzip_is_one_unit(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl.gz", gzip.compress(("\n".join(token_lines(3000)) + "\n").encode()))
    assert [u.stop for u in plan_units([path], SourceOptions(shard_size=SHARD, split_size=1024))] == [None]


def test_a_file_shorter_than_planned_is_an_error(tmp_path: Path) -> None:
    data = ("\n".join(token_lines(2000)) + "\n").encode()
    path = write(tmp_path / "a.jsonl", data)
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD)
    units = plan_units([path], options)
    Path(path).write_bytes(data[: units[-1].start + 10])
    with pytest.raises(InputFormatError, match="did it change during the pack"):
        docs_of(units[-1:], options)


# --- zstd frames ----------------------------------------------------------------------------


def zstd_multiframe(data: bytes, seed: int, *, checksum: bool = False, skippable: bool = False) -> bytes:
    """Frames cut at random bytes (mid-line), with content sizes, optional checksums and skippable frames."""
    rng = np.random.default_rng(seed)
    cctx = zstandard.ZstdCompressor(write_checksum=checksum)
    out, pos = [], 0
    while pos < len(data):
        step = int(rng.integers(1, 6000))
        out.append(cctx.compress(data[pos : pos + step]))
        if skippable and len(out) % 5 == 0:
            out.append((0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"xyz")
        pos += step
    return b"".join(out)


@pytest.mark.parametrize(("checksum", "skippable"), [(False, False), (True, True)])
def test_zstd_frames_split_mid_line_read_the_same_documents(tmp_path: Path, checksum: bool, skippable: bool) -> None:
    data = ("\n".join(token_lines(3000, seed=2, blank_every=11)) + "\n").encode()
    blob = zstd_multiframe(data, 3, checksum=checksum, skippable=skippable)
    path = write(tmp_path / "a.jsonl.zst", blob)
    with open(path, "rb") as f:
        frames = zstd_frames(f, len(blob))
    assert frames is not None and frames[-1][0] + frames[-1][1] == len(blob)
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD)
    units, parts, whole = split_and_whole(path, options)
    assert len(units) > 5 and all(u.span == "zstd_frames" for u in units)
    assert parts == whole and len(whole) == 3000


def test_zstd_a_line_longer_than_several_frames(tmp_path: Path) -> None:
    lines = token_lines(600, seed=4)
    lines.insert(300, json.dumps({"tokens": list(range(VOCAB - 1)) * 20}))  # ~80 KB
    data = "\n".join(lines).encode()  # and no final newline
    path = write(tmp_path / "a.jsonl.zst", zstd_multiframe(data, 5))
    units, parts, whole = split_and_whole(path, SourceOptions(shard_size=SHARD, split_size=8 * SHARD))
    assert len(units) > 3 and parts == whole and len(whole) == 601


def test_a_single_frame_or_a_non_zstd_file_is_one_unit(tmp_path: Path) -> None:
    data = ("\n".join(token_lines(3000)) + "\n").encode()
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD)
    one = write(tmp_path / "one.jsonl.zst", zstandard.ZstdCompressor().compress(data))
    assert [u.stop for u in plan_units([one], options)] == [None]
    bogus = write(tmp_path / "bogus.jsonl.zst", data)  # not zstd at all: the reader reports it
    assert [u.stop for u in plan_units([bogus], options)] == [None]
    with pytest.raises(InputFormatError, match="bogus.jsonl.zst"):
        docs_of(plan_units([bogus], options), options)


# --- errors name the line in the whole file -------------------------------------------------


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.zst"])
def test_errors_in_a_later_part_name_the_line_of_the_file(tmp_path: Path, name: str) -> None:
    lines = token_lines(3000, seed=6, blank_every=13)
    bad = len(lines) - 40
    lines[bad] = '{"tokens": [1, 2,'
    data = ("\n".join(lines) + "\n").encode()
    path = write(tmp_path / name, zstd_multiframe(data, 7) if name.endswith(".zst") else data)
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD)
    units = plan_units([path], options)
    assert len(units) > 3
    with pytest.raises(InputFormatError, match=rf"{name}:{bad + 1}: not valid JSON"):
        docs_of(units, options)


# --- Parquet row groups ---------------------------------------------------------------------


def parquet_file(path: Path, docs: int, row_group: int, seed: int = 8) -> str:
    rng = np.random.default_rng(seed)
    lists = [rng.integers(0, VOCAB - 1, int(rng.integers(1, 80))).tolist() for _ in range(docs)]
    pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path, row_group_size=row_group)
    return str(path)


def test_parquet_runs_of_row_groups(tmp_path: Path) -> None:
    path = parquet_file(tmp_path / "a.parquet", 3000, row_group=100)
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD, token_itemsize=2, eos_appended=True)
    units, parts, whole = split_and_whole(path, options)
    assert len(units) > 5 and all(u.span == "row_groups" for u in units)
    assert [u.first_document for u in units] == [u.start * 100 for u in units]
    assert parts == whole


def test_parquet_with_one_row_group_or_another_column_is_one_unit(tmp_path: Path) -> None:
    path = parquet_file(tmp_path / "one.parquet", 3000, row_group=10_000)
    options = SourceOptions(shard_size=SHARD, split_size=8 * SHARD, token_itemsize=2)
    assert [u.stop for u in plan_units([path], options)] == [None]
    many = parquet_file(tmp_path / "many.parquet", 3000, row_group=100)
    assert [u.stop for u in plan_units([many], replace(options, tokens_column="ids"))] == [None]


def test_parquet_token_error_numbers_the_document_in_the_file(small_splits: int, tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    lists = [rng.integers(0, VOCAB - 1, 50).tolist() for _ in range(3000)]
    lists[2500][3] = VOCAB + 5
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path, row_group_size=100)
    with pytest.raises(TokenRangeError, match=r"bad\.parquet: token id 1005 in document 2500 "):
        pack([str(path)], str(tmp_path / "ds"), OPTS)


# --- packing: byte-identical for any executor -----------------------------------------------


@pytest.fixture
def big_inputs(small_splits: int, tmp_path: Path) -> Iterator[list[str]]:
    jsonl = write(tmp_path / "a.jsonl", ("\r\n".join(token_lines(4000, seed=10, blank_every=29))).encode())
    zst = write(tmp_path / "b.jsonl.zst", zstd_multiframe(("\n".join(token_lines(3000, seed=11)) + "\n").encode(), 12))
    parquet = parquet_file(tmp_path / "c.parquet", 3000, row_group=64, seed=13)
    small = write(tmp_path / "d.jsonl", ("\n".join(token_lines(30, seed=14)) + "\n").encode())
    yield [jsonl, zst, parquet, small]


def _count_whole_shards(docs: list[list[int]], itemsize: int) -> int:
    """How many shards one unit per file would give: the cutter's rule over the whole stream."""
    shards, used = 0, 0
    for d in docs:
        used += (len(d) + 1) * itemsize + 4
        if used >= SHARD:
            shards, used = shards + 1, 0
    return shards + (used > 0)


def test_pack_identical_for_workers_and_parts(big_inputs: list[str], tmp_path: Path) -> None:
    units = plan_units(big_inputs, SourceOptions(shard_size=SHARD, token_itemsize=2, eos_appended=True))
    assert len(units) > 3 * len(big_inputs)
    one = pack(big_inputs, str(tmp_path / "w1"), OPTS)
    two = pack(big_inputs, str(tmp_path / "w2"), replace(OPTS, workers=2))
    assert two.version_id == one.version_id and two.shards == one.shards
    assert shard_bytes(tmp_path / "w2") == shard_bytes(tmp_path / "w1")
    for i in (2, 0, 1):
        pack_part(big_inputs, str(tmp_path / "parts"), i, 3, OPTS)
    assert merge_parts(str(tmp_path / "parts"), OPTS).version_id == one.version_id
    assert shard_bytes(tmp_path / "parts") == shard_bytes(tmp_path / "w1")
    # the documents are the whole files', in order; each cut costs at most one extra (partial) shard
    docs = read_back(str(tmp_path / "w1"))
    assert docs == docs_of(plan_units(big_inputs, SourceOptions(split_size=WHOLE)), SourceOptions())
    per_file = sum(
        _count_whole_shards(docs_of([u], SourceOptions()), 2)
        for u in plan_units(big_inputs, SourceOptions(split_size=WHOLE))
    )
    assert per_file < one.shards <= per_file + len(units) - len(big_inputs)


@pytest.mark.slow
def test_pack_on_ray_identical(big_inputs: list[str], tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'ferry-data[ray]')")
    local = pack(big_inputs, str(tmp_path / "local"), replace(OPTS, workers=2))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        on_ray = pack(big_inputs, str(tmp_path / "ray"), replace(OPTS, executor="ray"))
    finally:
        ray.shutdown()
    assert on_ray.version_id == local.version_id
    assert shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")


def test_split_inputs_on_every_backend(backend: Any, small_splits: int, tmp_path: Path) -> None:
    import fsspec

    local = [
        write(tmp_path / "a.jsonl", ("\n".join(token_lines(2000, seed=15, blank_every=17)) + "\n").encode()),
        parquet_file(tmp_path / "b.parquet", 2000, row_group=64, seed=16),
    ]
    remote = []
    for path in local:
        url = backend.url(f"in/{Path(path).name}")
        with fsspec.open(url, "wb", **backend.storage_options) as f:  # makes the folder where needed
            f.write(Path(path).read_bytes())
        remote.append(url)
    source = SourceOptions(
        shard_size=SHARD, token_itemsize=2, eos_appended=True, storage_options=backend.storage_options
    )
    units = plan_units(remote, source)
    assert {u.span for u in units} == {"bytes", "row_groups"} and len(units) > 6
    # without provenance (which names each input by its path) the inputs' location does not matter
    options = replace(OPTS, storage_options=backend.storage_options, input_storage_options=backend.storage_options,
                      origin=False)  # fmt: skip
    there = pack(remote, backend.url("ds"), options)
    here = pack(local, str(tmp_path / "local"), replace(OPTS, origin=False))
    assert there.version_id == here.version_id and there.shards == here.shards
