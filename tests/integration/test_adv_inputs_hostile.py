"""More hostile and careless inputs to ``ferry pack``: a tokenizer whose ids pass its own vocabulary
size, byte-order marks, a pickled ``.npy`` that runs code, a ``state.json`` listing a file twice,
a Hub download missing a shard, a file name with glob characters. Each either packs exactly the
input's tokens or ends in one line naming the file, never a traceback and nothing published."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ferry.shard_tools import open_dataset
from ferry.shard_tools.sources import SourceOptions, plan_units, read_unit
from ferry.shard_tools.sources.tokenizer import ByteTokenizer

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
PACK = ["--vocab-size", "1000", "--eos-id", "999"]


def ferry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FERRY, *args], capture_output=True, text=True, timeout=120)


def packed(proc: subprocess.CompletedProcess[str], out: Path) -> list[list[int]]:
    assert proc.returncode == 0, proc.stderr
    return [d.tolist() for d in open_dataset(str(out)).documents()]


def assert_refused(proc: subprocess.CompletedProcess[str], out: Path, *needles: str, code: int = 1) -> None:
    """One line on stderr naming what is wrong, the exit code, and nothing at ``out``."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.returncode == code, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))


def utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# --- tokenizers ----------------------------------------------------------------------------


def word_level_tokenizer(path: Path, vocab: dict[str, int]) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return str(path)


def test_tokenizer_ids_past_its_vocab_size_get_a_wide_enough_dtype(tmp_path: Path) -> None:
    """Observed: a tokenizer.json whose vocabulary has 3 entries, one with id 70000, reported a
    vocabulary of 3, so the pack chose uint16 and failed blaming the input file for id 70000."""
    tok = word_level_tokenizer(tmp_path / "tok.json", {"a": 0, "</s>": 1, "b": 70000})
    (tmp_path / "t.jsonl").write_text('{"text": "a b a"}\n{"text": "b"}\n')
    out = tmp_path / "ds"
    assert packed(ferry("pack", str(tmp_path / "t.jsonl"), "--out", str(out), "--tokenizer", tok), out) == [
        [0, 70000, 0],
        [70000],
    ]
    manifest = open_dataset(str(out)).manifest
    assert manifest.tokenizer.vocab_size == 70001 and manifest.token_dtype == "uint32"
    assert manifest.tokenizer.eos_id == 1


def bpe_tokenizer(path: Path, **settings: object) -> str:
    """A small byte-level BPE trained here, saved with extra top-level ``settings``."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["[UNK]", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["hello world foo bar baz"] * 50, trainer)
    doc = json.loads(tok.to_str())
    doc.update(settings)
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    "setting",
    [
        {"truncation": {"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0}},
        {
            "padding": {
                "strategy": "BatchLongest",
                "direction": "Right",
                "pad_to_multiple_of": None,
                "pad_id": 0,
                "pad_type_id": 0,
                "pad_token": "[UNK]",
            }
        },
    ],
    ids=["truncation", "padding"],
)
def test_tokenizer_json_truncation_and_padding_do_not_apply(tmp_path: Path, setting: dict[str, object]) -> None:
    """Observed: a tokenizer.json saved with truncation (max_length 3) cut every document to 3
    tokens, and one saved with padding padded every document of a batch to the longest, exit 0."""
    plain = bpe_tokenizer(tmp_path / "plain.json")
    configured = bpe_tokenizer(tmp_path / "configured.json", **setting)
    (tmp_path / "t.jsonl").write_text('{"text": "hello world foo bar baz hello"}\n{"text": "a"}\n')
    docs = []
    for tok in (plain, configured):
        out = tmp_path / Path(tok).stem
        docs.append(packed(ferry("pack", str(tmp_path / "t.jsonl"), "--out", str(out), "--tokenizer", tok), out))
    assert len(docs[0][0]) > 3 and len(docs[0][1]) == 1
    assert docs[1] == docs[0]


def tiktoken_file(path: Path) -> str:
    """A tiktoken BPE file of the 256 single bytes (rank = byte)."""
    import base64

    path.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    return f"tiktoken:{path}"


@pytest.mark.parametrize("kind", ["bytes", "tokenizer.json", "tiktoken"])
def test_lone_surrogate_in_jsonl_text_with_every_tokenizer(tmp_path: Path, kind: str) -> None:
    """Observed: '"a\\ud800b"' (valid JSON, no valid text) ended in a TypeError traceback from a
    tokenizer.json, and was packed as U+FFFD by a tiktoken file (tiktoken replaces it), exit 0."""
    tok = {
        "bytes": "bytes",
        "tokenizer.json": bpe_tokenizer(tmp_path / "tok.json"),
        "tiktoken": tiktoken_file(tmp_path / "r.bpe"),
    }[kind]
    eos = ["--eos-id", "0"] if kind == "tiktoken" else []
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"text": "fine \\ud83d\\ude00"}\n{"text": "a\\ud800b"}\n')  # a pair, then a lone one
    out = tmp_path / "ds"
    proc = ferry("pack", str(path), "--out", str(out), "--tokenizer", tok, *eos)
    assert_refused(proc, out, "t.jsonl:2", "'text' is not valid Unicode")
    path.write_bytes(b'{"text": "fine \\ud83d\\ude00"}\n')
    docs = packed(ferry("pack", str(path), "--out", str(out), "--tokenizer", tok, *eos), out)
    assert len(docs) == 1 and len(docs[0]) >= 5
    if kind != "tokenizer.json":  # byte-level ids are the UTF-8 bytes of the emoji
        assert docs == [utf8("fine \U0001f600")]


# --- byte-order marks ----------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("lines", [False, True])
def test_bom_at_the_start_of_a_text_file_is_not_a_token(tmp_path: Path, lines: bool) -> None:
    """Observed: a text file saved with a UTF-8 BOM packed its three bytes into the first document.
    Only the file's first BOM is an encoding mark: one starting a later line is text."""
    path = tmp_path / "t.txt"
    path.write_bytes(BOM + "héllo\r\n\ufeffworld\r\n".encode())
    out = tmp_path / "ds"
    flag = ["--lines"] if lines else []
    docs = packed(ferry("pack", str(path), "--out", str(out), "--tokenizer", "bytes", *flag), out)
    assert docs == ([utf8("héllo"), utf8("\ufeffworld")] if lines else [utf8("héllo\n\ufeffworld\n")])


def test_bom_at_the_start_of_a_jsonl_file_is_read(tmp_path: Path) -> None:
    """Observed: a JSON Lines file with a UTF-8 BOM was refused at line 1 as not JSON."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(BOM + b'{"text": "a"}\r\n{"text": "\xef\xbb\xbfb"}\r\n')
    out = tmp_path / "ds"
    assert packed(ferry("pack", str(path), "--out", str(out), "--tokenizer", "bytes"), out) == [
        utf8("a"),
        utf8("\ufeffb"),
    ]


@pytest.mark.parametrize(("name", "lines"), [("t.jsonl", False), ("t.txt", True), ("t.jsonl.zst", False)])
def test_bom_in_a_file_read_in_parts(tmp_path: Path, name: str, lines: bool) -> None:
    """A file cut into parts: only the part at byte 0 drops the BOM, every other line is kept."""
    import zstandard

    texts = [f"\ufeffdoc {i}" if i % 7 == 3 else f"doc {i}" for i in range(400)]  # raw U+FEFF inside lines
    if "jsonl" in name:
        body = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    else:
        body = "".join(f"{t}\n" for t in texts)
    data = BOM + body.encode()
    if name.endswith(".zst"):
        cctx = zstandard.ZstdCompressor()
        data = b"".join(cctx.compress(data[i : i + 1000]) for i in range(0, len(data), 1000))
    (tmp_path / name).write_bytes(data)
    options = SourceOptions(tokenizer=ByteTokenizer(), text_per_line=lines, split_size=997)
    units = plan_units([str(tmp_path / name)], options)
    assert len(units) >= 3
    docs = [
        batch.tokens[batch.offsets[i] : batch.offsets[i + 1]].tolist()
        for unit in units
        for batch in read_unit(unit, options)
        for i in range(len(batch.offsets) - 1)
    ]
    expected = [utf8(t) for t in texts]
    assert docs == expected


# --- .npy object arrays --------------------------------------------------------------------


class _OpensAFile:
    """Unpickling this calls ``open(path, "w")``: harmless, and visible as a new file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_an_object_npy_cannot_run_code(tmp_path: Path) -> None:
    """An object-dtype .npy is refused without running its pickle, which would call whatever it names
    (here: open() makes a file)."""
    marker = tmp_path / "ran"
    arr = np.empty(2, dtype=object)
    arr[0], arr[1] = np.array([1, 2]), _OpensAFile(marker)
    np.save(tmp_path / "evil.npy", arr, allow_pickle=True)
    out = tmp_path / "ds"
    assert_refused(ferry("pack", str(tmp_path / "evil.npy"), "--out", str(out), *PACK), out, "evil.npy", "open")
    assert not marker.exists()


class _LyingArray:
    """Pickles as ``np.save`` pickles an array, with the state replaced."""

    def __init__(self, state: tuple[object, ...]) -> None:
        self.state = state

    def __reduce__(self) -> tuple[object, ...]:
        reduced = np.empty(0, dtype=object).__reduce__()
        assert isinstance(reduced, tuple)
        return (reduced[0], reduced[1], self.state)


def lying_npy(path: Path, state: tuple[object, ...]) -> str:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": (2,)})
        f.write(pickle.dumps(_LyingArray(state), protocol=3))
    return str(path)


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ((1, (100_000,), np.dtype("O"), False, [1, 2]), "not 100000 elements"),  # NumPy read past the list
        ((1, (2**40,), np.dtype("u1"), False, b"xy"), "not 1099511627776 bytes"),
        ((1, (2,), np.dtype([("a", "<i4")]), False, b"\x00" * 8), "dtype"),
        ((1, (1,), np.dtype(("<i4", (2**20,))), False, b"\x00" * 4), "dtype"),
        ((1, (-1,), np.dtype("O"), False, []), "shape"),
        ("not a state", "state"),
    ],
    ids=["object-shape-past-list", "huge-shape", "fields", "subarray", "negative-shape", "not-a-tuple"],
)
def test_an_object_npy_whose_state_lies(tmp_path: Path, state: tuple[object, ...], needle: str) -> None:
    """Observed: an object array whose state gives a shape larger than its element list killed
    the pack with SIGSEGV (NumPy's own unpickling trusts it)."""
    path = lying_npy(tmp_path / "o.npy", state)
    out = tmp_path / "ds"
    assert_refused(ferry("pack", path, "--out", str(out), *PACK), out, "o.npy", needle)


def test_honest_object_npy_still_packs(tmp_path: Path) -> None:
    arr = np.empty(5, dtype=object)
    arr[0], arr[1], arr[2] = np.array([1, 2], dtype=np.int32), [3, np.int64(4)], np.array([], dtype=np.int64)
    arr[3], arr[4] = np.array([5, 6], dtype=">u2"), (7, 8)
    np.save(tmp_path / "o.npy", arr, allow_pickle=True)
    out = tmp_path / "ds"
    assert packed(ferry("pack", str(tmp_path / "o.npy"), "--out", str(out), *PACK), out) == [
        [1, 2],
        [3, 4],
        [],
        [5, 6],
        [7, 8],
    ]


# --- Hugging Face dataset directories ------------------------------------------------------


def saved_dataset(root: Path, docs: list[list[int]]) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"tokens": docs}).save_to_disk(str(root))
    return root


def test_state_json_listing_a_file_twice_is_refused(tmp_path: Path) -> None:
    """Observed: state.json naming its one Arrow file twice packed every row twice, exit 0."""
    root = saved_dataset(tmp_path / "saved", [[1, 2], [3]])
    state = json.loads((root / "state.json").read_text())
    name = state["_data_files"][0]["filename"]
    state["_data_files"] *= 2
    (root / "state.json").write_text(json.dumps(state))
    out = tmp_path / "ds"
    assert_refused(ferry("pack", str(root), "--out", str(out), *PACK), out, "state.json", f"{name} twice")


def hub_shard(data: Path, name: str, docs: list[list[int]]) -> None:
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"tokens": pa.array(docs, type=pa.list_(pa.int32()))}), data / name)


def test_hub_layout_missing_a_numbered_shard_is_refused(tmp_path: Path) -> None:
    """Observed: data/train-00000-of-00002.parquet alone (a download stopped half way) packed as the
    whole split, exit 0."""
    data = tmp_path / "repo" / "data"
    hub_shard(data, "train-00000-of-00002.parquet", [[1, 2]])
    hub_shard(data, "test-00000-of-00001.parquet", [[5]])
    out = tmp_path / "ds"
    proc = ferry("pack", str(tmp_path / "repo"), "--split", "train", "--out", str(out), *PACK)
    assert_refused(proc, out, "train-00001-of-00002", "missing")
    hub_shard(data, "train-00001-of-00002.parquet", [[3]])
    proc = ferry("pack", str(tmp_path / "repo"), "--split", "train", "--out", str(out), *PACK)
    assert packed(proc, out) == [[1, 2], [3]]


def test_hub_layout_with_two_shard_counts_is_refused(tmp_path: Path) -> None:
    """Leftovers of an older revision beside a newer one: neither set is the split."""
    data = tmp_path / "repo" / "data"
    hub_shard(data, "train-00000-of-00001-0a1b2c.parquet", [[1]])
    hub_shard(data, "train-00000-of-00002-3d4e5f.parquet", [[2]])
    hub_shard(data, "train-00001-of-00002-3d4e5f.parquet", [[3]])
    out = tmp_path / "ds"
    assert_refused(
        ferry("pack", str(tmp_path / "repo"), "--out", str(out), *PACK), out, "train", "of-00001", "of-00002"
    )


def test_hub_layout_with_a_shard_twice_is_refused(tmp_path: Path) -> None:
    """Two copies of shard 0 (different hash suffixes) and no shard 1: not the split's rows."""
    data = tmp_path / "repo" / "data"
    hub_shard(data, "train-00000-of-00002-0a1b2c.parquet", [[1]])
    hub_shard(data, "train-00000-of-00002-3d4e5f.parquet", [[1]])
    out = tmp_path / "ds"
    assert_refused(ferry("pack", str(tmp_path / "repo"), "--out", str(out), *PACK), out, "train-00001-of-00002")


# --- file names ----------------------------------------------------------------------------


def test_a_file_named_like_a_glob_is_that_file(tmp_path: Path) -> None:
    """Observed: 'd[1].jsonl' (an existing file) was expanded as a pattern: it packed d1.jsonl
    when that existed, and was refused as matching nothing when it did not."""
    named = tmp_path / "d[1].jsonl"
    named.write_text('{"tokens": [1]}\n')
    out = tmp_path / "alone"
    assert packed(ferry("pack", str(named), "--out", str(out), *PACK), out) == [[1]]
    (tmp_path / "d1.jsonl").write_text('{"tokens": [2, 2]}\n')
    out = tmp_path / "ambiguous"
    assert_refused(ferry("pack", str(named), "--out", str(out), *PACK), out, "d[1].jsonl", "d1.jsonl", "d[[]1]", code=2)
    out = tmp_path / "escaped"
    assert packed(ferry("pack", str(tmp_path / "d[[]1].jsonl"), "--out", str(out), *PACK), out) == [[1]]
    out = tmp_path / "pattern"
    assert packed(ferry("pack", str(tmp_path / "d?.jsonl"), "--out", str(out), *PACK), out) == [[2, 2]]


@pytest.mark.parametrize(
    "spellings",
    [["a.jsonl", "a.jsonl"], ["a.jsonl", "./a.jsonl"], ["a.jsonl", "ABS"], ["*.jsonl", "a.jsonl"]],
    ids=["same", "dot", "absolute", "glob-and-match"],
)
def test_the_same_file_given_twice_is_refused(tmp_path: Path, spellings: list[str]) -> None:
    """Observed: `ferry pack a.jsonl ./a.jsonl` packed every document of a.jsonl twice, exit 0."""
    (tmp_path / "a.jsonl").write_text('{"tokens": [1, 2]}\n')
    args = [str(tmp_path / "a.jsonl") if s == "ABS" else s for s in spellings]
    out = tmp_path / "ds"
    proc = subprocess.run(
        [*FERRY, "pack", *args, "--out", str(out), *PACK], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert_refused(proc, out, "a.jsonl", "twice", code=2)


@pytest.mark.parametrize("name", ["t.txt", "t.txt.zst"])
def test_text_line_numbers_of_a_split_file_count_lone_cr(tmp_path: Path, name: str) -> None:
    """Observed: --lines splits on \\r, \\n and \\r\\n (text mode) but a part of a split file
    numbered its lines from a count of \\n alone, so every line after a lone \\r was recorded
    (origin_row) with a wrong, smaller number than the same file read whole."""
    import zstandard

    data = "".join(f"a{i}\rb{i}\r\nc{i}\n" if i % 3 else f"d{i}\n" for i in range(1500)).encode()
    if name.endswith(".zst"):  # frames that end between a \r and its \n, or mid-line
        cctx = zstandard.ZstdCompressor()
        data = b"".join(cctx.compress(data[i : i + 701]) for i in range(0, len(data), 701))
    (tmp_path / name).write_bytes(data)

    def rows(split_size: int | None) -> tuple[int, list[int]]:
        options = SourceOptions(tokenizer=ByteTokenizer(), text_per_line=True, split_size=split_size)
        units = plan_units([str(tmp_path / name)], options)
        batches = [batch for unit in units for batch in read_unit(unit, options)]
        return len(units), [int(r) for batch in batches if batch.rows is not None for r in batch.rows]

    whole, parts = rows(None), rows(997)
    assert whole[0] == 1 and parts[0] > 3 and len(whole[1]) == 3500
    assert parts[1] == whole[1] == list(range(1, len(whole[1]) + 1))


def test_a_jsonl_record_naming_its_field_twice_is_refused(tmp_path: Path) -> None:
    """Observed: {"tokens": [1], "tokens": [2, 3]} packed [2, 3] (json keeps the last), exit 0.
    The field's name inside a value or a nested object is no repeat."""
    good = b'{"tokens": [4], "meta": {"tokens": "x"}, "note": "\\"tokens\\""}\n'
    path = tmp_path / "t.jsonl"
    path.write_bytes(good + b'{"tokens": [1], "tokens": [2, 3]}\n')
    out = tmp_path / "ds"
    assert_refused(
        ferry("pack", str(path), "--out", str(out), *PACK), out, "t.jsonl:2", "'tokens' appears more than once"
    )
    path.write_bytes(good)
    assert packed(ferry("pack", str(path), "--out", str(out), *PACK), out) == [[4]]


# --- paths that are no regular file --------------------------------------------------------


def _limit_memory() -> None:  # in the child: reading without end fails at 2 GiB, not at the machine's end
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize(
    ("link", "args", "needle", "code"),
    [
        ("m.idx", ["m.idx", *PACK], "m.idx: not a regular file", 1),
        ("tok.json", ["t.jsonl", "--tokenizer", "tok.json"], "tokenizer tok.json is not a regular file", 2),
        ("r.bpe", ["t.jsonl", "--tokenizer", "tiktoken:r.bpe", "--eos-id", "1"], "r.bpe is not a regular file", 2),
        ("saved/state.json", ["saved", *PACK], "state.json: not a regular file", 1),
        ("dict/dataset_dict.json", ["dict", *PACK], "dataset_dict.json: not a regular file", 1),
    ],
    ids=["megatron-idx", "tokenizer-json", "tiktoken", "state-json", "dataset-dict-json"],
)
def test_a_device_is_not_read_without_end(tmp_path: Path, link: str, args: list[str], needle: str, code: int) -> None:
    """Observed: a Megatron .idx, tokenizer.json, tiktoken file, or a dataset directory's state.json
    or dataset_dict.json linked to /dev/zero was read until memory ran out (the OOM killer ended
    the pack; under a limit, a MemoryError traceback)."""
    (tmp_path / link).parent.mkdir(exist_ok=True)
    (tmp_path / link).symlink_to("/dev/zero")
    (tmp_path / "m.bin").write_bytes(b"")
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n')
    out = tmp_path / "ds"
    proc = subprocess.run(
        [*FERRY, "pack", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        preexec_fn=_limit_memory,
    )
    assert_refused(proc, out, needle, code=code)


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_two_columns_of_one_name_are_refused(tmp_path: Path, suffix: str) -> None:
    """Observed: a Parquet or Arrow file with two columns named 'tokens' packed the first, exit 0."""
    table = pa.Table.from_arrays([pa.array([[1, 2]]), pa.array([[3, 4, 5]])], names=["tokens", "tokens"])
    path = tmp_path / f"two{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as writer:
            writer.write_table(table)
    out = tmp_path / "ds"
    assert_refused(
        ferry("pack", str(path), "--out", str(out), *PACK), out, f"two{suffix}", "2 columns are named 'tokens'"
    )
