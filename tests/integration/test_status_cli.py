"""``ferry status`` as a real process against a live service on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import pack, running_service, wait_until

from ferry.client.service.cli import render_status
from ferry.client.service.service_types import ErrorEntry, Limits, ReplicaCell, ReplicaMatrix, Status, Transfer

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]


def test_status_table_json_and_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path, monkeypatch) as svc:
        res = pack(svc.east("corpus"))
        wait_until(lambda: svc.west_version("corpus") == res.version_id, what="replication")

        out = subprocess.run([*FERRY, "status", "--server", svc.url], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == f"ferry status — {svc.url}"
        header = next(ln for ln in lines if ln.startswith("DATASET"))
        assert header.split() == ["DATASET", "east", "west"]
        row = next(ln for ln in lines if ln.startswith("corpus"))
        assert row.split() == ["corpus", "source", "100.0%", "complete"]
        assert "no transfers in flight" in out.stdout

        env = {**os.environ, "MY_TOKEN": "whatever"}  # --token-env: sent, and ignored where reads are open
        js = subprocess.run(
            [*FERRY, "status", "--server", svc.url, "--json", "--token-env", "MY_TOKEN"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        doc = json.loads(js.stdout)
        assert doc["status"]["copied_bytes_total"] == res.stored_bytes
        assert {(c["cluster"], c["state"]) for c in doc["replicas"]["cells"]} == {
            ("east", "source"),
            ("west", "complete"),
        }

        watch = subprocess.Popen(
            [*FERRY, "status", "--server", svc.url, "--watch", "--interval", "0.2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert watch.stdout is not None
        frames = 0
        deadline = time.monotonic() + 60
        while frames < 2 and time.monotonic() < deadline:  # refreshed at least once
            frames += watch.stdout.readline().startswith("ferry status — ")
        watch.send_signal(signal.SIGINT)
        watch.communicate(timeout=30)
        assert frames == 2
        assert watch.returncode == 0  # Ctrl-C ends --watch quietly


def test_status_against_nothing_fails_cleanly() -> None:
    from conftest import free_port

    out = subprocess.run(
        [*FERRY, "status", "--server", f"http://127.0.0.1:{free_port()}", "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "cannot reach the ferry service" in out.stderr and "Traceback" not in out.stderr


def test_render_shows_transfers_and_errors() -> None:
    cell = ReplicaCell("ds", "west", "destination", "syncing", None, "v1", 3, 10, 30, 100, 30.0, 125.0)
    status = Status(False, True, "0.1", 5, 1, 1, 30, 10.0, 70, 7, 7.0, Limits(4, None, {}), 60, False)
    t = Transfer(1, "ds", "v1", "shards/abc.arrow.zst", "east", "west", 50, 100, 50.0, 2048.0, 0.0)
    e = ErrorEntry(9, 0.0, "ds", "v1", "west", "shards/bad.arrow.zst", "digest mismatch", False, 2)
    text = render_status("http://x", status, ReplicaMatrix(["ds"], ["east", "west"], [cell]), [t], [e])
    assert " 30.0% syncing lag 2m" in text
    assert "[##########..........]  50.0%" in text and "2.0 KiB/s" in text
    assert "ERRORS (1)" in text and "digest mismatch" in text
