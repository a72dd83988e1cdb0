"""Values read from storage reach no terminal raw: every CLI line escapes control characters.

A manifest is digested, not signed: whoever can write the bucket can publish a well-formed
manifest whose name holds an OSC title escape and a newline, and a lease file is plain JSON.
What ``ferry inspect``, ``ferry verify``, ``ferry sync`` and the error line print is checked on
the bytes a terminal would receive: no C0/C1 control, no DEL, no bidi override, no U+2028/9,
and exactly the lines the command means to print.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import pack

from ferry.shard_tools.cli import print_error, printable
from ferry.shard_tools.format.header import version_id_of

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
# what a hostile writer puts in a field: OSC (set title), BEL, a newline and a forged line, RLO, the C1
# CSI, a line separator, DEL, CSI "clear screen", CR, NEL
EVIL_NAME = "evil\x1b]0;pwned\x07\nversion   FORGED\u202e\x9b31m\u2028end\x7f"
EVIL_TOKENIZER = "tok\x1b[2J\r\x85\u2066x\u2069"
# UTF-8 of C1 controls (U+0080-U+009F), of the bidi controls and of U+2028/9
_RAW = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def _raw_controls(data: bytes) -> list[bytes]:
    """Every raw control sequence start in ``data`` (newlines between lines are fine)."""
    return _RAW.findall(data)


def _forge(root: Path) -> str:
    """A dataset whose current manifest carries hostile strings, with a valid version id (as a writer
    with bucket access could publish it), and a published version whose file name holds an escape."""
    url = str(root / "ds")
    pack(url, 20)
    doc = json.loads((root / "ds" / "manifest.json").read_text())
    doc["name"] = EVIL_NAME
    doc["tokenizer"]["name"] = EVIL_TOKENIZER
    doc["created_at"] = "2026\x1b[31m"
    doc["tool_version"] = "0\x1b[0m\nforged"
    body = {k: v for k, v in doc.items() if k not in ("version_id", "created_at", "tool_version")}
    doc["version_id"] = version_id_of(body)
    data = json.dumps(doc, indent=1).encode()
    (root / "ds" / "manifest.json").write_bytes(data)
    (root / "ds" / "versions" / f"{doc['version_id']}.json").write_bytes(data)
    (root / "ds" / "versions" / "x\x1b[5mblink.json").write_bytes(data)
    return url


def _ferry(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*FERRY, *args], capture_output=True, timeout=120, env={**os.environ})


def test_printable_escapes_c0_c1_bidi_and_separators_only() -> None:
    assert printable("plain — ünïcode 数据 ✓") == "plain — ünïcode 数据 ✓"
    assert printable(EVIL_NAME) == "evil\\x1b]0;pwned\\x07\\nversion   FORGED\\u202e\\x9b31m\\u2028end\\x7f"
    assert printable("a\ud800b\u200bc\ufeff") == "a\\ud800b\\u200bc\\ufeff"  # lone surrogate, zero-width, BOM


def test_the_one_error_printer_writes_one_escaped_line(capsys: pytest.CaptureFixture[str]) -> None:
    print_error("sync", RuntimeError("held by x\x1b]0;t\x07\nferry sync: FORGED\u2028\x9b2J"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ferry sync: error: held by x\\x1b]0;t\\x07")
    assert not _raw_controls(err.encode()[:-1])


def test_inspect_prints_no_raw_control_and_no_forged_line(tmp_path: Path) -> None:
    url = _forge(tmp_path)
    proc = _ferry("inspect", url, "--shards")
    assert proc.returncode == 0, proc.stderr
    assert _raw_controls(proc.stdout) == []
    lines = proc.stdout.decode().splitlines()
    heads = [line.split()[0] for line in lines[:6]]
    assert heads == ["dataset", "version", "tokens", "bytes", "tokenizer", "versions"]
    assert not any(line.startswith("version   FORGED") or line == "forged" for line in lines)
    assert "evil\\x1b]0;pwned\\x07\\nversion   FORGED\\u202e" in lines[0]
    assert "tok\\x1b[2J\\r\\x85\\u2066x\\u2069" in lines[4] and "x\\x1b[5mblink" in lines[5]
    assert len(lines) == 6 + 1 + 2  # header lines, the shard table's title and its two shards


def test_inspect_json_is_ascii_json_that_keeps_the_values(tmp_path: Path) -> None:
    url = _forge(tmp_path)
    proc = _ferry("inspect", url, "--json")
    assert proc.returncode == 0, proc.stderr
    assert _raw_controls(proc.stdout) == [] and proc.stdout.isascii()
    doc = json.loads(proc.stdout)
    assert doc["name"] == EVIL_NAME and doc["tokenizer"]["name"] == EVIL_TOKENIZER


def test_verify_names_a_hostile_version_escaped(tmp_path: Path) -> None:
    url = _forge(tmp_path)
    proc = _ferry("verify", url, "--version", "v\x1b]0;x\x07\nOK: forged")
    assert proc.returncode != 0
    assert _raw_controls(proc.stdout + proc.stderr) == []
    assert proc.stderr.count(b"\n") == 1, proc.stderr


def test_sync_error_line_escapes_the_lease_holder(tmp_path: Path) -> None:
    src = str(tmp_path / "src")
    pack(src, 20)
    dst = tmp_path / "dst"
    dst.mkdir()
    lease = {
        "holder": "sync:h\x1b]0;x\x07\nferry sync: FORGED\u202e",
        "kind": "sync\x1b[31m",
        "host": "other-host\x9b",
        "pid": 1,
        "acquired_at": time.time(),
        "expires_at": time.time() + 3600,
    }
    (dst / ".ferry-lease.json").write_text(json.dumps(lease))
    proc = _ferry("sync", src, str(dst))
    assert proc.returncode == 1
    assert _raw_controls(proc.stdout + proc.stderr) == []
    err = proc.stderr.decode().splitlines()
    assert len(err) == 1 and err[0].startswith("ferry sync: error: ") and "h\\x1b]0;x\\x07" in err[0], err
