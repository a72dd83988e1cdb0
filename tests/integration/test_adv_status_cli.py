"""``ferry status`` against a hostile server: nothing it sends may drive the operator's terminal.

A small fake service on 127.0.0.1 answers the four reads ``ferry status`` makes with names and
reasons full of terminal escape sequences (colour, clear screen, window title, C1 CSI, bidi
override); the table must show them as visible escapes, ``--json`` must carry them exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ferry.client.service.cli import render_status
from ferry.client.service.service_types import ErrorEntry, Limits, ReplicaCell, ReplicaMatrix, Status, Transfer

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
DS = "corpus\x1b[2J\x1b[31mRED"  # clear screen, then red
CLUSTER = "west\x1b]0;owned\x07"  # OSC: sets the window title
REASON = "digest mismatch\x9b2J\r\nFAKE LINE\u202etxt.exe\x7f"  # C1 CSI, CR/LF, bidi override, DEL
SHARD = "shards/\x1b[1Abad.arrow.zst"  # cursor up
UNSAFE = {"Cc", "Cf", "Zl", "Zp"}


def _status() -> dict[str, Any]:
    return {
        "paused": False, "ready": True, "version": "0.1\x1b[5m", "uptime_seconds": 5.0,
        "transfers_in_flight": 1, "open_errors": 1, "copied_bytes_total": 10, "rate_bps": 1.0,
        "pending_bytes": 5, "pending_shards": 1, "eta_seconds": 5.0,
        "limits": {"transfers": 2, "global_bps": None, "links": {f"east->{CLUSTER}": None}},
        "sla_minutes": 60.0, "read_protected": False,
    }  # fmt: skip


def _replicas() -> dict[str, Any]:
    cell = {
        "dataset": DS, "cluster": CLUSTER, "role": "destination", "state": "failed\x1b[0m",
        "published_version": None, "target_version": "v1\x1b[K", "verified_shards": 1, "total_shards": 2,
        "verified_bytes": 5, "total_bytes": 10, "percent": 50.0, "lag_seconds": 30.0,
    }  # fmt: skip
    return {"datasets": [DS], "clusters": ["east", CLUSTER], "cells": [cell]}


def _transfers() -> list[dict[str, Any]]:
    return [
        {
            "id": 1, "dataset": DS, "version": "v1", "shard": SHARD, "source": "east", "destination": CLUSTER,
            "bytes_done": 5, "bytes_total": 10, "percent": 50.0, "rate_bps": 1.0, "started_at": 0.0,
        }
    ]  # fmt: skip


def _errors() -> list[dict[str, Any]]:
    return [
        {
            "id": 7, "at": 0.0, "dataset": DS, "version": "v1", "cluster": CLUSTER, "shard": SHARD,
            "reason": REASON, "retryable": True, "attempts": 2,
        }
    ]  # fmt: skip


ROUTES = {
    "/api/v1/status": _status,
    "/api/v1/replicas": _replicas,
    "/api/v1/transfers": _transfers,
    "/api/v1/errors": _errors,
}


@pytest.fixture
def hostile_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A fake service; the dict's ``fail`` key, when set, makes /status answer 500 with that text."""
    knobs: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            path = self.path.split("?", 1)[0]
            if path == "/api/v1/status" and knobs.get("fail"):
                self._send(500, "text/plain", knobs["fail"].encode())
            elif path in ROUTES:
                self._send(200, "application/json", json.dumps(ROUTES[path]()).encode())
            else:
                self._send(404, "application/json", b'{"detail": "not found"}')

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", knobs
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _unsafe(text: str, allowed: str = "\n") -> list[str]:
    return [repr(ch) for ch in text if ch not in allowed and unicodedata.category(ch) in UNSAFE]


def test_status_table_shows_escape_sequences_as_text(hostile_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = hostile_server
    out = subprocess.run([*FERRY, "status", "--server", url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert _unsafe(out.stdout) == [], out.stdout
    assert "corpus\\x1b[2J\\x1b[31mRED" in out.stdout  # visible, so the operator sees what the server sent
    assert "digest mismatch\\x9b2J\\r\\nFAKE LINE\\u202etxt.exe" in out.stdout
    assert "ERRORS (1)" in out.stdout


def test_status_json_carries_the_strings_exactly(hostile_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = hostile_server
    out = subprocess.run([*FERRY, "status", "--server", url, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert _unsafe(out.stdout) == []  # JSON escapes them itself
    doc = json.loads(out.stdout)
    assert doc["replicas"]["datasets"] == [DS]
    assert doc["errors"][0]["reason"] == REASON and doc["errors"][0]["shard"] == SHARD
    assert doc["status"]["limits"]["links"] == {f"east->{CLUSTER}": None}


def test_status_error_message_from_the_server_is_escaped(hostile_server: tuple[str, dict[str, Any]]) -> None:
    url, knobs = hostile_server
    knobs["fail"] = "boom\x1b[2J\x1b]0;owned\x07"
    out = subprocess.run([*FERRY, "status", "--server", url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert _unsafe(out.stderr) == [], out.stderr
    assert "500" in out.stderr and "boom\\x1b[2J" in out.stderr and "Traceback" not in out.stderr


def test_render_status_escapes_every_server_string() -> None:
    cell = ReplicaCell(DS, CLUSTER, "destination", "syncing\x1b[0m", None, "v1", 3, 10, 30, 100, 30.0, 125.0)
    status = Status(False, True, "0.1", 5, 1, 1, 30, 10.0, 70, 7, 7.0, Limits(4, None, {}), 60, False)
    t = Transfer(1, DS, "v1", SHARD, "east\x1b[8m", CLUSTER, 50, 100, 50.0, 2048.0, 0.0)
    e = ErrorEntry(9, 0.0, DS, "v1", CLUSTER, SHARD, REASON, False, 2)
    text = render_status("http://x\x1b[2J", status, ReplicaMatrix([DS], ["east", CLUSTER], [cell]), [t], [e])
    assert _unsafe(text) == [], text
    assert "30.0% syncing\\x1b[0m lag 2m" in text  # the cell is still found under its escaped names
    assert "east\\x1b[8m->west\\x1b]0;owned\\x07" in text


def test_printable_keeps_ordinary_text() -> None:
    from ferry.client.service.cli import printable

    assert printable("corpus-v2.en_US ünïcode 数据 😀") == "corpus-v2.en_US ünïcode 数据 😀"
    assert printable("a\x00b\x1b\x7f\x85\u200b\u2028") == "a\\x00b\\x1b\\x7f\\x85\\u200b\\u2028"
