"""The replication daemon under hostile input and careless operators (issue 13).

Forged log lines through dataset names and manifest values, unreadable source manifests,
dataset names the API refuses, and a read-only destination.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from helpers import Service, pack, running_service, wait_until, write_serve_config
from processes import terminate

from ferry.service.replication.engine import Engine
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.errors import StorageError
from ferry.shard_tools.format.header import version_id_of
from ferry.shard_tools.storage.store import resolve

FORGED = "1999-01-01 00:00:00,000 WARNING ferry.daemon: FORGED"


def _point_shard_table_at(dataset: Path, table_path: str) -> None:
    """Rewrite ``dataset``'s manifest.json (with a matching version id) so its shard table is ``table_path``."""
    doc = json.loads((dataset / "manifest.json").read_text())
    doc["shard_table"]["path"] = table_path
    doc["version_id"] = version_id_of({k: v for k, v in doc.items() if k not in ("version_id", "created_at",
                                                                                   "tool_version")})  # fmt: skip
    (dataset / "manifest.json").write_text(json.dumps(doc))


def _read_until(path: Path, needles: list[str], proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace")
        if all(n in text for n in needles) or proc.poll() is not None:
            return text
        time.sleep(0.05)
    return path.read_text(errors="replace")


def test_values_in_log_lines_cannot_forge_lines(tmp_path: Path) -> None:
    """A newline in a dataset name, and a newline + terminal escape in a manifest value that an error
    message quotes, reach `ferry serve`'s log escaped: no line is forged, no escape sent."""
    src = tmp_path / "src"
    pack(str(src / "good"), 60, seed=1)
    pack(str(src / f"evil\n{FORGED}-NAME"), 60, seed=2)
    pack(str(src / "table"), 60, seed=3)
    _point_shard_table_at(src / "table", f"tables/t\n{FORGED}-TABLE\x1b[2J.parquet")  # missing: the error quotes it
    config = write_serve_config(tmp_path, free_port())
    ferry = Path(sys.executable).with_name("ferry")
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([str(ferry), "serve", "--config", str(config)], stderr=log_file, text=True)
        try:
            _read_until(log_path, ["FORGED-NAME", "FORGED-TABLE", "good src->d1"], proc)
        finally:
            terminate(proc)
    log = log_path.read_text(errors="replace")
    assert proc.returncode == 0, log
    assert "FORGED-NAME" in log and "FORGED-TABLE" in log and "good src->d1" in log, log  # both were logged
    forged = [line for line in log.splitlines() if line.startswith("1999-")]
    assert forged == [], log
    assert "\x1b" not in log and "\\x1b[2J" in log
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")
    printed = ("    ", "ferry: dashboard at ")  # traceback lines, the one line serve prints
    assert all(stamp.match(line) or line.startswith(printed) for line in log.splitlines()), log


def test_log_formatter_escapes_every_control_character() -> None:
    from ferry.service.cli import SafeFormatter

    fmt = SafeFormatter("%(levelname)s %(name)s: %(message)s")
    args = ("a\r\nb\x00\t", "c\x1b[31m\x85\u2028\x7f")
    record = logging.LogRecord("ferry.daemon", logging.WARNING, __file__, 1, "dataset %s: %s", args, None)
    assert fmt.format(record) == "WARNING ferry.daemon: dataset a\\r\\nb\\x00\\t: c\\x1b[31m\\x85\\u2028\\x7f"
    try:
        raise ValueError(f"bad\n{FORGED}\x1b[2J")
    except ValueError:
        record = logging.LogRecord("ferry.daemon", logging.ERROR, __file__, 1, "pass %s crashed", ("x\ny",),
                                   sys.exc_info())  # fmt: skip
    first, *rest = fmt.format(record).splitlines()
    assert first == "ERROR ferry.daemon: pass x\\ny crashed"
    assert rest[0] == "    Traceback (most recent call last):" and rest[-1] == f"    {FORGED}\\x1b[2J"
    assert all(line.startswith("    ") for line in rest)


@contextlib.contextmanager
def _service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Service, httpx.Client]]:
    with running_service(tmp_path, monkeypatch) as svc, httpx.Client(base_url=svc.url) as http:
        yield svc, http


def _errors(http: httpx.Client) -> list[dict[str, Any]]:
    r = http.get("/api/v1/errors")
    assert r.status_code == 200, r.text
    return list(r.json())


def _wait_errors(http: httpx.Client, n: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        errors = _errors(http)
        return errors if len(errors) >= n else None

    return list(wait_until(enough, what=f"{n} open errors"))


def test_unreadable_source_manifest_is_an_open_error_until_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    east = tmp_path / "east"
    pack(str(east / "truncated"), 60, seed=4)
    pack(str(east / "garbage"), 60, seed=5)
    good_manifest = (east / "truncated" / "manifest.json").read_bytes()
    (east / "truncated" / "manifest.json").write_bytes(good_manifest[: len(good_manifest) // 2])
    (east / "garbage" / "manifest.json").write_bytes(b"\x00\xff not json at all \x1b")
    with _service(tmp_path, monkeypatch) as (svc, http):
        errors = _wait_errors(http, 2)
        assert sorted(e["dataset"] for e in errors) == ["garbage", "truncated"]
        for e in errors:
            assert e["cluster"] == "east" and e["shard"] == "manifest.json" and not e["retryable"]
            assert f"dataset '{e['dataset']}' at east: cannot read its manifest.json" in e["reason"]
            assert "not valid JSON" in e["reason"]
        listed = {d["name"]: d["version"] for d in http.get("/api/v1/datasets").json()}
        assert listed == {"garbage": None, "truncated": None}  # seen, with no readable version
        metrics = http.get("/metrics").text
        assert 'ferry_errors{cluster="east",dataset="truncated",retryable="false"} 1.0' in metrics
        assert 'ferry_errors{cluster="east",dataset="garbage",retryable="false"} 1.0' in metrics
        n_polls = svc.daemon.passes
        wait_until(lambda: svc.daemon.passes >= n_polls + 2, what="two more polls")
        assert len(_errors(http)) == 2  # one open error per dataset, not one more per poll

        (east / "truncated" / "manifest.json").write_bytes(good_manifest)  # the operator repairs it
        wait_until(lambda: svc.west_version("truncated"), what="the repaired dataset to replicate")
        assert [e["dataset"] for e in _errors(http)] == ["garbage"]
        shutil.rmtree(east / "garbage")  # …and removes the other one
        wait_until(lambda: _errors(http) == [], what="the error of the removed dataset to clear")


def test_names_the_api_refuses_are_reported_not_replicated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    east = tmp_path / "east"
    refused = ["two words", "-dash-first", "a..b", "x" * 129, "tab\there"]
    pack(str(east / "fine.name_1"), 40, seed=6)
    for i, name in enumerate(refused):
        pack(str(east / name), 40, seed=10 + i)
    (east / "notes (old).txt").write_text("not a dataset")  # a stray file: no error for it
    with _service(tmp_path, monkeypatch) as (svc, http):
        wait_until(lambda: svc.west_version("fine.name_1"), what="the allowed dataset to replicate")
        errors = _wait_errors(http, len(refused))
        assert sorted(e["dataset"] for e in errors) == sorted(refused)
        for e in errors:
            assert e["cluster"] == "east" and not e["retryable"]
            assert e["reason"].startswith(f"dataset name {e['dataset']!r} at east is not allowed: ")
            assert e["reason"].endswith("; rename it")
        assert sorted(p.name for p in (tmp_path / "west").iterdir()) == ["fine.name_1"]
        assert [d["name"] for d in http.get("/api/v1/datasets").json()] == ["fine.name_1"]

        (east / "two words").rename(east / "two-words")
        wait_until(lambda: svc.west_version("two-words"), what="the renamed dataset to replicate")
        wait_until(lambda: "two words" not in [e["dataset"] for e in _errors(http)], what="its error to clear")
    assert not (tmp_path / "west" / "two words").exists()


def test_the_name_rule_lives_in_the_core() -> None:
    """The API and the daemon apply one rule, and the replication core loads no part of the API."""
    from ferry.service import names
    from ferry.service.api import auth

    assert auth.valid_name is names.valid_name and auth.NAME_PATTERN == names.NAME_PATTERN
    assert names.name_problem("ok-1.x") is None and "'..'" in str(names.name_problem("a..b"))
    code = (
        "import sys, ferry.service.daemon; print(sorted(m for m in sys.modules if m.startswith('ferry.service.api')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


@contextlib.contextmanager
def _read_only_mount(target: Path) -> Iterator[Path]:
    """A real read-only filesystem (tmpfs mounted ``-o ro``) at ``target``: chmod does not stop root, this does."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    try:
        with pytest.raises(OSError) as info:
            (target / "probe").write_bytes(b"x")
        assert info.value.errno == errno.EROFS
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True, timeout=30)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    with _read_only_mount(tmp_path / "ro") as target:
        yield target


def test_read_only_destination_is_fatal_not_retried(tmp_path: Path, read_only_dir: Path) -> None:
    """A read-only destination fails the pass at once (the writer lease cannot be written), not
    each shard five times with backoff."""
    pack(str(tmp_path / "src"), 60, seed=7)
    state = State(None)
    engine = Engine(Executor(retries=5, backoff=(0.5, 10.0)), state)
    locations = {"src": resolve(str(tmp_path / "src")), "dst": resolve(str(read_only_dir / "ds"))}
    t0 = time.monotonic()
    with pytest.raises(StorageError) as info:
        engine.sync_pass("ds", "src", "dst", locations)  # with a retry, a backoff of ≥ 0.25 s first
    assert time.monotonic() - t0 < 0.25 and not info.value.retryable
    assert "Read-only file system" in str(info.value) and "not retried" in str(info.value)
    assert state.history(limit=1000) == []  # no shard was even tried


def test_read_only_shard_writes_are_fatal_not_retried(tmp_path: Path) -> None:
    """Past the lease, a shard write refused by the store is one attempt, fatal, and not tried again."""
    res = pack(str(tmp_path / "src"), 60, seed=7)
    (tmp_path / "dst" / "ds").mkdir(parents=True)
    state = State(None)
    engine = Engine(Executor(retries=5, backoff=(0.5, 10.0)), state)
    locations = {"src": resolve(str(tmp_path / "src")), "dst": resolve(str(tmp_path / "dst" / "ds"))}
    with _read_only_mount(tmp_path / "dst" / "ds" / "shards"):
        out = engine.sync_pass("ds", "src", "dst", locations)
        assert len(out.failed) == res.shards and not out.published
        for r in out.failed:
            assert (r.attempts, r.retryable) == (1, False)
            assert "Read-only file system" in str(r.error) and "not retried" in str(r.error)
        assert len(state.history(limit=1000)) == res.shards  # one attempt per shard, no more
        assert state.fatal("ds", "dst") == {r.job.shard.path for r in out.failed}
        again = engine.sync_pass("ds", "src", "dst", locations)  # the next pass does not try them again
        assert again.skipped_failed == res.shards and len(state.history(limit=1000)) == res.shards


def test_daemon_reports_a_read_only_destination_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pack(str(tmp_path / "east" / "corpus"), 60, seed=8)
    with _read_only_mount(tmp_path / "west"), _service(tmp_path, monkeypatch) as (svc, http):
        [error] = _wait_errors(http, 1)
        assert (error["cluster"], error["retryable"], error["attempts"]) == ("west", False, 1), error
        assert "Read-only file system" in error["reason"]
        n_polls = svc.daemon.passes
        wait_until(lambda: svc.daemon.passes >= n_polls + 3, what="three more polls")
        assert svc.daemon.history(limit=1000) == []  # no shard copy was attempted
        assert [(e["id"], e["attempts"]) for e in _errors(http)] == [(error["id"], 1)]


def test_access_refusals_are_classified_fatal() -> None:
    """The classification of store refusals: s3fs's mapping of AccessDenied, a raw 403, and errnos."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from ferry.shard_tools.storage.store import not_permitted, storage_error

    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"},
                          "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject")  # fmt: skip
    mapped = translate_boto_error(denied)
    assert isinstance(mapped, PermissionError)
    for exc in (mapped, denied, OSError(errno.EROFS, "Read-only file system"), OSError(errno.EACCES, "denied")):
        err = storage_error("copy failed", exc)
        assert not err.retryable and not_permitted(exc)
    slow = ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    for exc in (slow, OSError(errno.EIO, "I/O error"), ConnectionResetError()):
        assert storage_error("copy failed", exc).retryable and not not_permitted(exc)
