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

from shard_tools import open_dataset
from shard_tools.sources import SourceOptions, plan_units, read_unit
from shard_tools.tokenizer import ByteTokenizer

FERRY = [sys.executable, "-m", "shard_tools.cli"]
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
