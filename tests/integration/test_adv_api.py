"""The HTTP API under hostile input: huge or endless bodies, no token, odd values, secrets in URLs.

Most tests talk to a real ``ferry serve`` process (so its memory can be read from /proc) over raw
sockets where the point is what the server does before the client has finished sending.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from configs import Api, Cluster, FerryToml, Rule
from helpers import TOKEN, Service, pack, running_service, wait_until

AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = 2**20
MAX_BODY_BYTES = 64 * 1024  # the documented limit of a request body
# every control route with a body it accepts (pause/resume take none, and must refuse one as well)
MUTATIONS = [
    ("POST", "/api/v1/sync"),
    ("POST", "/api/v1/pause"),
    ("POST", "/api/v1/resume"),
    ("PUT", "/api/v1/limits"),
    ("POST", "/api/v1/scrub"),
    ("POST", "/api/v1/retry"),
]


@dataclass
class Serve:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def peak_rss_kib(self) -> int:
        """The server's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM in /proc status")


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    from conftest import free_port

    root = tmp_path_factory.mktemp("adv-api")
    for name in ("east", "west"):
        (root / name).mkdir()
    port = free_port()
    config = FerryToml(
        clusters={"east": Cluster(root / "east"), "west": Cluster(root / "west")},
        rules=[Rule("east", ["west"])],
        api=Api(port=port, token_env="FT_ADV_TOKEN"),
        state_dir="state",
        poll_interval=0.3,
    ).write(root / "ferry.toml")
    env = {**os.environ, "FT_ADV_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    log = root / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(config), "--access-log"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    running = Serve(proc, port, log)
    try:
        wait_until(lambda: _healthy(running.url) or proc.poll() is not None, timeout=60, what="ferry serve")
        assert proc.poll() is None, log.read_text()
        yield running
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _raw_request(port: int, head: str, body_parts: list[bytes], timeout: float = 5.0) -> tuple[int, bytes, float]:
    """Send a request line + headers + some body bytes (maybe far less than announced), then read the answer.

    Returns (status, response bytes, seconds from the last byte sent to the answer). A server that
    waits for the rest of the body makes this raise ``TimeoutError``.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        for part in body_parts:
            sock.sendall(part)
        sent = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - sent
        sock.settimeout(0.5)
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk:  # the small JSON answer: until the server closes, or a short pause
                chunk = sock.recv(65536)
                data += chunk
    return int(data.split(b" ", 2)[1]), data, took


def _head(method: str, path: str, *headers: str) -> str:
    return "\n".join([f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, ""])


def _huge_json() -> Iterator[bytes]:
    """100 MiB of a valid JSON document (a long array), produced 64 KiB at a time."""
    yield b'{"transfers": ['
    for _ in range(100 * MIB // 65536):
        yield b"1," * 32768
    yield b"1]}"


# ---- the token is checked before any body byte is read ---------------------------------------------------


@pytest.mark.parametrize(("method", "path"), MUTATIONS)
def test_no_token_is_refused_before_the_announced_100mib_body_arrives(serve: Serve, method: str, path: str) -> None:
    head = _head(method, path, "Content-Type: application/json", f"Content-Length: {100 * MIB}")
    status, answer, took = _raw_request(serve.port, head, [b"[" * 65536])  # 64 KiB of the 100 MiB announced
    assert status == 401, answer
    assert took < 2.0
    assert b"connection: close" in answer.lower()  # the server will not read the rest


def test_wrong_token_is_refused_before_the_body_arrives(serve: Serve) -> None:
    head = _head("PUT", "/api/v1/limits", "Authorization: Bearer wrong", f"Content-Length: {100 * MIB}")
    status, answer, _ = _raw_request(serve.port, head, [b"{"])
    assert status == 403, answer
    assert TOKEN.encode() not in answer


def test_malformed_body_without_token_is_401_not_422(serve: Serve) -> None:
    r = httpx.post(f"{serve.url}/api/v1/sync", content=b'{"dataset": [[[', headers={"Content-Type": "application/json"})
    assert r.status_code == 401, r.text


def test_streamed_100mib_bodies_leave_the_server_memory_bounded(serve: Serve) -> None:
    http = httpx.Client(base_url=serve.url, timeout=60)
    limits = http.get("/api/v1/limits").json()
    before = serve.peak_rss_kib()
    start = time.monotonic()
    for headers in ({}, AUTH):  # no token: 401; with it: 413 once 64 KiB have arrived
        r = http.put("/api/v1/limits", content=_huge_json(), headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == (413 if headers else 401), r.text
    assert time.monotonic() - start < 20
    grown = serve.peak_rss_kib() - before
    assert grown < 32 * 1024, f"the server's peak memory grew by {grown} KiB for two refused 100 MiB bodies"
    assert http.get("/api/v1/limits").json() == limits  # nothing was applied


# ---- body size cap ------------------------------------------------------------------------------------------


def test_announced_oversize_body_is_413_at_once(serve: Serve) -> None:
    head = _head("PUT", "/api/v1/limits", f"Authorization: Bearer {TOKEN}", f"Content-Length: {MAX_BODY_BYTES + 1}")
    status, answer, took = _raw_request(serve.port, head, [])  # not one body byte sent
    assert status == 413, answer
    assert took < 2.0
    assert b"64 KiB" in answer


def test_chunked_body_is_cut_as_soon_as_it_passes_the_limit(serve: Serve) -> None:
    head = _head("PUT", "/api/v1/limits", f"Authorization: Bearer {TOKEN}", "Transfer-Encoding: chunked")
    chunk = b"4000\r\n" + b" " * 0x4000 + b"\r\n"  # 16 KiB of JSON whitespace per chunk
    n = MAX_BODY_BYTES // 0x4000 + 1
    status, answer, took = _raw_request(serve.port, head, [chunk] * n)  # past the limit, never terminated
    assert status == 413, answer
    assert took < 2.0


def test_a_body_just_under_the_limit_is_still_read(serve: Serve) -> None:
    body = b'{"transfers": 4' + b" " * (MAX_BODY_BYTES - 100) + b"}"
    r = httpx.put(f"{serve.url}/api/v1/limits", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


# ---- validation errors ---------------------------------------------------------------------------------------

MARK = "ECHO-MARK-7f3a"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/limits", json.dumps({"transfers": MARK * 100})),
        ("/api/v1/limits", json.dumps({"links": {"east->west": MARK}})),
        ("/api/v1/limits", json.dumps({"links": {f"{MARK}\x1b[31m" * 10: "x"}})),
        ("/api/v1/sync", json.dumps({"dataset": f"../{MARK}"})),
        ("/api/v1/sync", json.dumps({MARK * 20: 1})),
        ("/api/v1/scrub", '{"cluster": "' + MARK + '", '),  # not JSON
        ("/api/v1/retry", json.dumps({"id": MARK})),
    ],
)
def test_validation_errors_never_echo_the_body(serve: Serve, path: str, body: str) -> None:
    method = "PUT" if path.endswith("limits") else "POST"
    r = httpx.request(
        method, f"{serve.url}{path}", content=body.encode(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code in (404, 422), r.text
    assert MARK not in r.text and "\\u001b" not in r.text
    if r.status_code == 422:
        for item in r.json()["detail"]:
            assert set(item) == {"loc", "msg", "type"}, item


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/api/v1/limits", {"transfers": True}),
        ("PUT", "/api/v1/limits", {"transfers": "3"}),
        ("PUT", "/api/v1/limits", {"transfers": 2.5}),
        ("PUT", "/api/v1/limits", {"global_bps": True}),
        ("PUT", "/api/v1/limits", {"global_bps": "1000"}),
        ("PUT", "/api/v1/limits", {"links": {"east->west": True}}),
        ("POST", "/api/v1/retry", {"id": True}),
        ("POST", "/api/v1/retry", {"id": "1"}),
    ],
)
def test_booleans_and_strings_are_not_numbers(serve: Serve, method: str, path: str, body: object) -> None:
    http = httpx.Client(base_url=serve.url, headers=AUTH)
    before = http.get("/api/v1/limits").json()
    r = http.request(method, path, json=body)
    assert r.status_code == 422, r.text
    assert http.get("/api/v1/limits").json() == before


def test_real_numbers_are_still_accepted(serve: Serve) -> None:
    http = httpx.Client(base_url=serve.url, headers=AUTH)
    r = http.put("/api/v1/limits", json={"transfers": 4, "global_bps": 0, "links": {"east->west": 1.5e6}})
    assert r.status_code == 200, r.text
    assert r.json()["links"] == {"east->west": 1.5e6}
    assert http.put("/api/v1/limits", json={"transfers": 3.0}).json()["transfers"] == 3  # JSON: 3.0 is the integer 3
    assert http.put("/api/v1/limits", json={"links": {"east->west": 0}}).status_code == 200


# ---- the access log ------------------------------------------------------------------------------------------


def test_access_log_never_shows_query_string_secrets(serve: Serve) -> None:
    secrets = {
        "token": "QS-SECRET-1",
        "access_token": "QS-SECRET-2",
        "X-Amz-Signature": "QS-SECRET-3",
        "api%5Fkey": "QS-SECRET-4",  # percent-encoded name: api_key
        "password": "QS-SECRET-5",
    }
    query = "&".join(f"{k}={v}" for k, v in secrets.items()) + "&limit=7"
    assert httpx.get(f"{serve.url}/api/v1/errors?{query}").status_code == 200
    line = wait_until(
        lambda: next((ln for ln in serve.log.read_text().splitlines() if "GET /api/v1/errors?" in ln), None),
        timeout=10,
        what="the access-log line",
    )
    assert "token=***" in line and "limit=7" in line, line
    text = serve.log.read_text()
    for value in secrets.values():
        assert value not in text, f"{value} leaked into the access log"


# ---- open_errors is the number of open errors ----------------------------------------------------------------


@pytest.fixture
def svc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    with running_service(tmp_path, monkeypatch) as s:
        yield s


def test_open_errors_counts_what_errors_lists(svc: Service) -> None:
    res = pack(svc.east("corpus"))
    victim = sorted((Path(svc.east("corpus")) / "shards").iterdir())[1]
    good = victim.read_bytes()
    victim.write_bytes(good[:-64] + bytes(64))  # a wrong digest: the copy fails (after its retry)
    errors = wait_until(svc.client.errors, timeout=30, what="an error for the corrupt shard")
    assert svc.client.status().open_errors == len(errors) == 1

    victim.write_bytes(good)
    assert svc.client.retry(errors[0].id).affected == 1
    wait_until(lambda: svc.west_version("corpus") == res.version_id, timeout=30, what="publication after retry")
    assert svc.client.errors() == []
    assert svc.client.status().open_errors == 0
