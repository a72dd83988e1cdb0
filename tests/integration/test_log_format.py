"""`--log-format json` of `ferry serve` and `ferry sync` (one JSON object per stderr line), and `ferry --version`."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from conftest import free_port
from helpers import pack, write_serve_config
from processes import terminate

from ferry import shard_tools
from ferry.shard_tools.dataset import open_dataset

FERRY = Path(sys.executable).with_name("ferry")
HOSTILE = "evil\n\x1b[2J\x7f\x85\u2028-NAME"  # a newline, a terminal escape, DEL, C1 NEL, a line separator
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
_RAW_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _records(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object with the four fields every record has."""
    out = []
    for line in text.splitlines():
        rec = json.loads(line)  # fails the test on any line that is not JSON
        assert isinstance(rec, dict) and {"ts", "level", "logger", "message"} <= set(rec), line
        assert _STAMP.match(rec["ts"]) and rec["level"] in ("debug", "info", "warning", "error", "critical"), line
        out.append(rec)
    return out


def _wait_for(path: Path, done: Any, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        recs = _records(path.read_text()) if path.read_bytes().endswith(b"\n") else []
        if done(recs) or proc.poll() is not None or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


def _datasets(src: Path) -> str:
    pack(str(src / "good"), 60, seed=1)
    pack(str(src / "holey"), 60, seed=2)
    victim = open_dataset(str(src / "holey")).manifest.shards[0].path
    os.remove(src / "holey" / victim)  # that shard cannot be copied
    (src / "broken").mkdir()
    (src / "broken" / "manifest.json").write_text("not json")
    pack(str(src / HOSTILE), 60, seed=3)  # a name the daemon refuses, and reports
    return victim


def test_serve_json_logs_one_object_per_line_with_dataset_fields(tmp_path: Path) -> None:
    victim = _datasets(tmp_path / "src")
    port = free_port()
    config = write_serve_config(tmp_path, port)
    log_path = tmp_path / "serve.log"

    def seen(recs: list[dict[str, Any]]) -> bool:
        names = {r.get("dataset") for r in recs}
        return {"good", "broken", HOSTILE} <= names and any(r.get("failed_shards") for r in recs)

    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [str(FERRY), "serve", "--config", str(config), "--log-format", "json", "--access-log"], stderr=log_file
        )
        try:
            assert _wait_for(log_path, seen, proc), log_path.read_text()
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics?token=sekrit-42", timeout=10)
            assert metrics.status_code == 200
            _wait_for(log_path, lambda recs: any("GET /metrics" in r["message"] for r in recs), proc)
        finally:
            terminate(proc)
    raw = log_path.read_text()
    assert proc.returncode == 0, raw
    assert not _RAW_CONTROL.search(raw.replace("\n", "")), "a control character reached the log unescaped"
    recs = _records(raw)

    good = next(r for r in recs if r.get("dataset") == "good" and "copied" in r["message"])
    assert (good["logger"], good["level"], good["cluster"], good["source"]) == ("ferry.daemon", "info", "d1", "src")
    holey = next(r for r in recs if r.get("failed_shards"))
    assert (holey["dataset"], holey["cluster"], holey["failed_shards"]) == ("holey", "d1", [victim])
    broken = next(r for r in recs if r.get("dataset") == "broken")
    assert (broken["level"], broken["cluster"]) == ("warning", "src") and "manifest.json" in broken["message"]
    hostile = next(r for r in recs if r.get("dataset") == HOSTILE)  # escaped on the line, exact once parsed
    assert hostile["cluster"] == "src" and "not allowed" in hostile["message"]
    assert any(r["logger"] == "ferry.api" and "dashboard at" in r["message"] for r in recs)
    assert any(r["logger"] == "uvicorn.access" and "GET /metrics?token=***" in r["message"] for r in recs)
    assert "sekrit-42" not in raw  # the access log's redaction holds in JSON too
    assert recs[-1]["message"] == "daemon stopped"


def test_serve_json_logs_a_startup_error_as_one_record(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(FERRY), "serve", "--config", str(tmp_path / "missing.toml"), "--log-format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # a ConfigError keeps its exit code
    (rec,) = _records(proc.stderr)
    assert rec["level"] == "error" and rec["message"].startswith("ferry serve: error: cannot read config")


def test_sync_json_logs_failed_shards_and_errors(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    pack(str(src), 60, seed=4)
    victim = open_dataset(str(src)).manifest.shards[0].path
    os.remove(src / victim)
    proc = subprocess.run(
        [str(FERRY), "sync", str(src), str(dst), "--retries", "1", "--log-format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "NOT published" in proc.stdout, proc.stderr
    failed = [r for r in _records(proc.stderr) if r.get("shard")]
    assert [(r["shard"], r["level"], r["source"], r["destination"]) for r in failed] == [
        (victim, "error", str(src), str(dst))
    ]
    missing = subprocess.run(
        [str(FERRY), "sync", str(tmp_path / "nothing"), str(dst), "--log-format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    (rec,) = _records(missing.stderr)
    assert missing.returncode == 1 and rec["logger"] == "ferry.sync" and "no manifest.json" in rec["message"]


def test_json_formatter_escapes_every_control_character_losslessly() -> None:
    from ferry.service.cli import JsonFormatter

    fmt = JsonFormatter()
    args = ("a\r\nb\x00\t", "c\x1b[31m\x85\u2028\u2029\x7f")
    record = logging.LogRecord("ferry.daemon", logging.WARNING, __file__, 1, "dataset %s: %s", args, None)
    record.dataset, record.cluster, record.unrelated = args[0], "west", "not a log field"
    line = fmt.format(record)
    assert "\n" not in line and not _RAW_CONTROL.search(line)
    doc = json.loads(line)
    assert doc["message"] == f"dataset {args[0]}: {args[1]}" and doc["dataset"] == args[0] and doc["cluster"] == "west"
    assert "unrelated" not in doc and "shard" not in doc
    try:
        raise ValueError("bad\n\x1b[2J")
    except ValueError:
        record = logging.LogRecord("ferry.daemon", logging.ERROR, __file__, 1, "crashed", (), sys.exc_info())
    line = fmt.format(record)
    assert "\n" not in line and not _RAW_CONTROL.search(line)
    assert json.loads(line)["exc"].endswith("ValueError: bad\n\x1b[2J")


def test_version_prints_the_package_version_without_loading_commands() -> None:
    probe = (
        "import sys; from ferry.shard_tools.cli import main; rc = main(['--version']); "
        "print(rc, sorted(m for m in ('fastapi', 'ferry.service.cli', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines() == [f"ferry {shard_tools.__version__}", "0 []"], proc.stderr
    assert shard_tools.__version__ == importlib.metadata.version("ferry-data")
    cli = subprocess.run([str(FERRY), "--version"], capture_output=True, text=True, timeout=60)
    assert (cli.returncode, cli.stdout) == (0, f"ferry {shard_tools.__version__}\n")
