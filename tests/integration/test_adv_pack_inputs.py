"""Hostile inputs to ``ferry pack``: one line on stderr naming the file (and line / document /
sequence), exit 1, never a traceback, never a silently wrong dataset. Real subprocesses."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.shard_tools import MegatronIndexError, open_dataset
from ferry.shard_tools.format.megatron import _HEADER, read_index, write_megatron

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
PACK = ["--vocab-size", "1000", "--eos-id", "999"]
DOCS = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
Edit = Callable[[np.ndarray, np.ndarray], None]  # rewrites (lengths, pointers) in place


def ferry(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FERRY, *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == code, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- Megatron indexes that lie ------------------------------------------------------------


def megatron(tmp_path: Path, docs: list[list[int]] = DOCS, name: str = "m") -> str:
    prefix = str(tmp_path / name)
    write_megatron(prefix, [np.asarray(d) for d in docs], np.dtype(np.uint16))
    return prefix


def patch_index(prefix: str, edit: Edit) -> None:
    """Rewrite the lengths and pointers of ``prefix.idx`` in place (same size)."""
    path = Path(prefix + ".idx")
    data = bytearray(path.read_bytes())
    nseq = _HEADER.unpack_from(data)[3]
    off = _HEADER.size
    lengths = np.frombuffer(data, np.int32, nseq, off).copy()
    pointers = np.frombuffer(data, np.int64, nseq, off + 4 * nseq).copy()
    edit(lengths, pointers)
    data[off : off + 12 * nseq] = lengths.tobytes() + pointers.tobytes()
    path.write_bytes(bytes(data))


def set_pointer(i: int, value: int) -> Edit:
    return lambda lengths, pointers: pointers.__setitem__(i, value)


def set_length(i: int, value: int) -> Edit:
    return lambda lengths, pointers: lengths.__setitem__(i, value)


def test_lying_pointer_is_refused_not_packed_wrong(tmp_path: Path) -> None:
    """Observed: pointer[1] = pointer[0] packed document 0's tokens twice, exit 0, verify OK."""
    prefix = megatron(tmp_path)
    patch_index(prefix, set_pointer(1, 0))
    out = tmp_path / "ds"
    proc = ferry("pack", prefix + ".idx", "--out", str(out), *PACK)
    assert_one_line_error(proc, "m.idx", "sequence 1")
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (set_pointer(1, -6), "sequence 1"),  # wrapped around to the end before
        (set_pointer(1, 10**6), "sequence 1"),  # a middle pointer past the end
        (set_pointer(1, 7), "sequence 1"),  # not a multiple of the item size
        (set_pointer(0, 2), "sequence 0"),
        (set_length(0, 10**6), "sequence 0"),  # the first length too long
        (set_length(0, 2), "sequence 1"),  # too short: sequence 1 no longer starts where 0 ends
        (set_length(2, -1), "sequence 2"),
        (set_length(2, 2), "trailing"),  # the last sequence stops short of the end of .bin
    ],
)
def test_lying_lengths_and_pointers(tmp_path: Path, edit: Edit, needle: str) -> None:
    prefix = megatron(tmp_path)
    patch_index(prefix, edit)
    with pytest.raises(MegatronIndexError, match=needle):
        read_index(prefix)
    proc = ferry("pack", prefix + ".bin", "--out", str(tmp_path / "ds"), *PACK)
    assert_one_line_error(proc, "m.idx", needle)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=30), st.data())
def test_any_single_lie_is_caught(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], data: st.DataObject
) -> None:
    """An honest index reads; changing any one length or pointer to any other value is refused."""
    prefix = str(tmp_path_factory.mktemp("lie") / "m")
    write_megatron(prefix, [np.ones(n, dtype=np.uint16) for n in lengths], np.dtype(np.uint16))
    assert read_index(prefix).lengths.tolist() == lengths
    i = data.draw(st.integers(0, len(lengths) - 1))
    field = data.draw(st.sampled_from(["length", "pointer"]))
    old = lengths[i] if field == "length" else 2 * sum(lengths[:i])
    new = data.draw(st.integers(-(2**31), 2**31 - 1).filter(lambda v: v != old))
    patch_index(prefix, set_length(i, new) if field == "length" else set_pointer(i, new))
    with pytest.raises(MegatronIndexError, match="sequence"):
        read_index(prefix)


def test_odd_and_empty_bin(tmp_path: Path) -> None:
    prefix = megatron(tmp_path)
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\x00")  # 19 bytes of 2-byte tokens
    assert_one_line_error(ferry("pack", prefix + ".idx", "--out", str(tmp_path / "a"), *PACK), "m.bin", "2-byte")
    Path(prefix + ".bin").write_bytes(b"")
    assert_one_line_error(ferry("pack", prefix + ".idx", "--out", str(tmp_path / "b"), *PACK), "m.idx", "sequence")


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "needle"),
    [
        (18, "<Q", 2**62, "needs exactly"),  # a sequence count the file cannot hold
        (26, "<Q", 3, "needs exactly"),  # a document count that leaves bytes over
        (17, "<B", 6, "not an integer token type"),
        (17, "<B", 42, "unknown dtype code"),
        (9, "<Q", 2, "version 2"),
        (-8, "<q", 2, "document indices"),  # the last document index is not the sequence count
        (-16, "<q", 5, "document 3 starts at sequence 3, before document 2"),
    ],
)
def test_corrupt_index_header_and_documents(tmp_path: Path, offset: int, fmt: str, value: int, needle: str) -> None:
    prefix = megatron(tmp_path)
    data = bytearray(Path(prefix + ".idx").read_bytes())
    struct.pack_into(fmt, data, offset % len(data), value)
    Path(prefix + ".idx").write_bytes(bytes(data))
    proc = ferry("pack", prefix + ".idx", "--out", str(tmp_path / "ds"), *PACK)
    assert_one_line_error(proc, "m.idx", needle)


def test_index_with_trailing_bytes(tmp_path: Path) -> None:
    prefix = megatron(tmp_path)
    with open(prefix + ".idx", "ab") as f:
        f.write(b"\x00" * 3)  # e.g. a multimodal index's sequence modes
    assert_one_line_error(ferry("pack", prefix + ".idx", "--out", str(tmp_path / "ds"), *PACK), "m.idx", "exactly")


def test_honest_edge_cases_still_pack(tmp_path: Path) -> None:
    """No false alarms: empty sequences (an empty .bin) and an index with no sequences at all."""
    prefix = megatron(tmp_path, [[], [], [5]], name="e")
    assert ferry("pack", prefix + ".idx", "--out", str(tmp_path / "e_ds"), *PACK).returncode == 0
    assert [d.tolist() for d in open_dataset(str(tmp_path / "e_ds")).documents()] == [[], [], [5]]
    prefix = megatron(tmp_path, [[], []], name="z")
    assert os.path.getsize(prefix + ".bin") == 0
    proc = ferry("pack", prefix + ".idx", "--out", str(tmp_path / "z_ds"), *PACK)
    assert proc.returncode == 0, proc.stderr


def test_a_bad_index_among_workers(tmp_path: Path) -> None:
    """With --workers 2 the error keeps its type and message across the process pool."""
    good = megatron(tmp_path, [[1] * 50] * 40, name="good")
    bad = megatron(tmp_path, name="bad")
    patch_index(bad, set_pointer(2, 0))
    proc = ferry("pack", good + ".idx", bad + ".idx", "--out", str(tmp_path / "ds"), "--workers", "2", *PACK)
    assert_one_line_error(proc, "bad.idx", "sequence 2")


def test_token_range_error_names_the_absolute_sequence(tmp_path: Path) -> None:
    """The bad id sits in the second unit: the error numbers sequences from the file's start."""
    prefix = megatron(tmp_path, [[1] * 100] * 50 + [[1, 5000]], name="v")
    proc = ferry("pack", prefix + ".idx", "--out", str(tmp_path / "ds"), "--shard-size", "1KiB", *PACK)
    assert_one_line_error(proc, "v", "token id 5000 in document 50")


# --- JSON Lines, .npy, Parquet, text ------------------------------------------------------


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


JSONL_CASES = {
    "int64-overflow": (b'{"tokens": [1, 2]}\n{"tokens": [1, 9223372036854775808]}\n', "big.jsonl:2"),
    "very-negative": (b'{"tokens": [-9223372036854775809]}\n', "big.jsonl:1"),
    "deep": (b'{"tokens": [1]}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n", "big.jsonl:2"),
    "long-int-literal": (b'{"tokens": [' + b"9" * 5000 + b"]}\n", "big.jsonl:1"),
    "not-utf8": (b'{"tokens": [1]}\n\n{"tokens": [2]}\n\xff\xfe\n', "big.jsonl:4"),
    "float": (b'{"tokens": [1, 2.5]}\n', "big.jsonl:1"),
    "string": (b'{"tokens": [1, "a"]}\n', "big.jsonl:1"),
    "nan": (b'{"tokens": [1, NaN]}\n', "big.jsonl:1"),
    "array-record": (b"[1, 2]\n", "big.jsonl:1"),
    "null-record": (b"null\n", "big.jsonl:1"),
    "missing-field": (b'{"ids": [1]}\n', "big.jsonl:1"),
    "negative-id": (b'{"tokens": [1]}\n{"tokens": [3, -2]}\n', "document 1"),
}


@pytest.mark.parametrize("case", list(JSONL_CASES))
def test_hostile_jsonl(tmp_path: Path, case: str) -> None:
    data, needle = JSONL_CASES[case]
    path = write(tmp_path / "big.jsonl", data)
    assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK), "big.jsonl", needle)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_hostile_jsonl_among_workers(tmp_path: Path) -> None:
    good = write(tmp_path / "good.jsonl", b'{"tokens": [1, 2]}\n' * 20)
    bad = write(tmp_path / "big.jsonl", JSONL_CASES["deep"][0])
    proc = ferry("pack", good, bad, "--out", str(tmp_path / "ds"), "--workers", "2", *PACK)
    assert_one_line_error(proc, "big.jsonl:2", "nested too deeply")


def test_lone_surrogate_text(tmp_path: Path) -> None:
    """``"\\ud800"`` is valid JSON but not encodable text."""
    path = write(tmp_path / "t.jsonl", b'{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    proc = ferry("pack", path, "--out", str(tmp_path / "ds"), "--tokenizer", "bytes")
    assert_one_line_error(proc, "t.jsonl:2", "Unicode")


def test_corrupt_zstd_jsonl(tmp_path: Path) -> None:
    good = zstandard.ZstdCompressor().compress(b'{"tokens": [1, 2]}\n' * 1000)
    path = write(tmp_path / "c.jsonl.zst", good[: len(good) // 2] + b"\x00" * 64)
    assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK), "c.jsonl.zst")


def test_zstd_jsonl_still_reads(tmp_path: Path) -> None:
    data = zstandard.ZstdCompressor().compress(b'{"tokens": [1, 2]}\r\n{"tokens": [3]}')  # CRLF, no final newline
    path = write(tmp_path / "ok.jsonl.zst", data)
    assert ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK).returncode == 0
    assert [d.tolist() for d in open_dataset(str(tmp_path / "ds")).documents()] == [[1, 2], [3]]


def object_npy(path: Path, items: list[object]) -> str:
    arr = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        arr[i] = item
    np.save(path, arr, allow_pickle=True)
    return str(path)


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ([[1, 2], [[1, 2], [3]]], "document 1"),  # ragged: np.asarray raises ValueError
        ([[1, 2], {"a": 1}], "document 1"),
        ([np.array([1]), np.array([2**64 - 1], dtype=np.uint64)], "document 1"),  # would wrap to -1
        ([[1], [2.5]], "document 1"),
    ],
)
def test_hostile_object_npy(tmp_path: Path, items: list[object], needle: str) -> None:
    path = object_npy(tmp_path / "o.npy", items)
    assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK), "o.npy", needle)


def test_npy_that_is_not_npy(tmp_path: Path) -> None:
    """A pickle or zip named .npy is refused before np.load would unpickle or open it."""
    for name, data in [("p.npy", pickle.dumps({"a": 1})), ("z.npy", b"PK\x03\x04" + b"\x00" * 40)]:
        path = write(tmp_path / name, data)
        assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK), name, "not a .npy")
    path = object_npy(tmp_path / "t.npy", [np.arange(100), np.arange(5)])
    data = Path(path).read_bytes()
    write(tmp_path / "t.npy", data[: len(data) // 2])  # truncated pickle
    assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK), "t.npy")


def test_npy_stream_truncated_or_lying_header(tmp_path: Path) -> None:
    """A plain array that cannot be mapped is an error, not read into memory whole (or at all)."""
    np.save(tmp_path / "s.npy", np.arange(1000, dtype=np.int32))
    data = (tmp_path / "s.npy").read_bytes()
    path = write(tmp_path / "s.npy", data[:500])
    assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "a"), *PACK), "s.npy", "truncated")
    with open(tmp_path / "h.npy", "wb") as f:  # a header promising 2**50 int64 tokens, then 8 bytes
        np.lib.format.write_array_header_1_0(f, {"descr": "<i8", "fortran_order": False, "shape": (2**50,)})
        f.write(b"\x00" * 8)
    assert_one_line_error(ferry("pack", str(tmp_path / "h.npy"), "--out", str(tmp_path / "b"), *PACK), "h.npy")


def parquet(path: Path, column: pa.Array, name: str = "tokens") -> str:
    pq.write_table(pa.table({name: column}), path)
    return str(path)


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["a", "b"]),
        pa.array([[1.5], [2.0]]),
        pa.array([1, 2]),
        pa.array([[[1]], [[2]]]),
        pa.array([[1, 2]], type=pa.list_(pa.int32(), 2)),
        pa.array([[1, None]]),
        pa.array([[1, 2**64 - 1]], type=pa.list_(pa.uint64())),
        pa.array([[1, -3]]),
    ],
    ids=["string", "float-list", "int", "nested", "fixed-size", "null-id", "uint64-max", "negative"],
)
def test_hostile_parquet_token_column(tmp_path: Path, column: pa.Array) -> None:
    path = parquet(tmp_path / "p.parquet", column)
    assert_one_line_error(ferry("pack", path, "--out", str(tmp_path / "ds"), *PACK), "p.parquet")


def test_parquet_text_not_utf8(tmp_path: Path) -> None:
    offsets = pa.py_buffer(np.array([0, 2], dtype=np.int32).tobytes())
    bad = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(b"\xff\xfe")])  # unvalidated
    path = parquet(tmp_path / "u.parquet", bad, name="text")
    proc = ferry("pack", path, "--out", str(tmp_path / "ds"), "--tokenizer", "bytes")
    assert_one_line_error(proc, "u.parquet", "UTF-8")


@pytest.mark.parametrize("lines", [False, True])
def test_text_not_utf8_or_corrupt(tmp_path: Path, lines: bool) -> None:
    flag = ["--lines"] if lines else []
    path = write(tmp_path / "t.txt", b"hello \xff\xfe world\n")
    proc = ferry("pack", path, "--out", str(tmp_path / "a"), "--tokenizer", "bytes", *flag)
    assert_one_line_error(proc, "t.txt", "UTF-8")
    good = zstandard.ZstdCompressor().compress(b"hello world\n" * 1000)
    path = write(tmp_path / "t.txt.zst", good[: len(good) // 2] + b"\x00" * 64)
    proc = ferry("pack", path, "--out", str(tmp_path / "b"), "--tokenizer", "bytes", *flag)
    assert_one_line_error(proc, "t.txt.zst")


def test_a_multi_line_library_message_prints_as_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arrow's thrift errors and NumPy's unpickling errors span lines; the CLI joins them."""
    import ferry.shard_tools.packer.packing
    from ferry.shard_tools.cli import main
    from ferry.shard_tools.errors import InputFormatError

    def fail(*args: object, **kwargs: object) -> None:
        raise InputFormatError("x.parquet: not a readable Parquet file (thrift\nDeserializing failed.\n)")

    monkeypatch.setattr(ferry.shard_tools.packer.packing, "pack", fail)
    assert main(["pack", "x.parquet", "--out", str(tmp_path / "ds"), *PACK]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(thrift; Deserializing failed.; )" in err
