"""The API stays up under slow and many clients, and its sockets never starve the daemon of descriptors.

A real ``ferry serve`` with a low ``RLIMIT_NOFILE`` is flooded from 127.0.0.1 by sockets that send
their headers a byte at a time, while ``/readyz`` is probed and a dataset is replicated. The
in-process tests drive each bound alone: header and body timeouts, a silent socket, idle
keep-alives over the cap, a client that never reads its responses, oversized request heads, and
the event-stream cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from helpers import TOKEN_ENV, Service, pack, running_service, wait_until, write_serve_config
from processes import terminate
from slowloris import FloodProcess

from ferry.service.api import connections as connections_module
from ferry.service.api import server as server_module
from ferry.service.config import ApiConfig

SERVER_NOFILE = 256  # the served process's soft descriptor limit in the flood test
_DEFERS = hasattr(socket, "TCP_DEFER_ACCEPT")  # Linux: the kernel holds a new connection back until it sends
_PROBE = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"


def _limit_descriptors() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_NOFILE, hard))


@pytest.mark.slow
def test_slowloris_flood_leaves_probes_and_replication_alone(tmp_path: Path) -> None:
    port = free_port()
    config = write_serve_config(tmp_path, port)  # [api] defaults: no bound is set for the test
    log_path = tmp_path / "serve.log"
    ferry = Path(sys.executable).with_name("ferry")
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([str(ferry), "serve", "--config", str(config)], stderr=log_file,
                                preexec_fn=_limit_descriptors)  # fmt: skip
    try:
        wait_until(lambda: _get(port, "/readyz") == 200, 60, "ferry serve to be ready", proc=proc)
        with FloodProcess(port, count=3 * SERVER_NOFILE // 2, duration=90) as flood:
            wait_until(lambda: flood.opened >= flood.count, 30, "the flood's sockets to connect")
            probes = [_get(port, "/readyz") for _ in range(20)]
            pack(str(tmp_path / "src" / "ds"), 200)
            started = time.monotonic()
            wait_until(lambda: (tmp_path / "d1" / "ds" / "manifest.json").exists(), 60,
                       "the dataset to replicate during the flood", proc=proc, interval=0.1)  # fmt: skip
            took = time.monotonic() - started
            probes += [_get(port, "/readyz") for _ in range(20)]
            wait_until(lambda: flood.closed >= flood.count, 30, "the server to close the slow sockets")
        assert proc.poll() is None
    finally:
        terminate(proc)
    log = log_path.read_text(errors="replace")
    assert "Too many open files" not in log, log[-3000:]
    assert probes.count(200) == len(probes), probes
    assert took < 20, f"replication took {took:.1f}s during the flood"
    # header_timeout, plus the server's check interval and the flood's own (it sees a close on its next drip)
    assert flood.longest < ApiConfig.header_timeout + 1.5, flood.longest
    print(
        f"flood: {flood.opened} slow sockets; readyz {probes.count(200)}/{len(probes)}; replicated in {took:.2f}s; "
        f"longest slow socket {flood.longest:.2f}s"
    )


def _get(port: int, path: str) -> int:
    """One GET on a fresh connection: its status, or 0 when it could not be made in 3 s."""
    try:
        with httpx.Client(timeout=3) as http:
            return http.get(f"http://127.0.0.1:{port}{path}").status_code
    except httpx.HTTPError:
        return 0


# -- in process, one bound at a time ----------------------------------------------------------------


@contextlib.contextmanager
def _service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **api: Any) -> Iterator[Service]:
    settings = {"token_env": TOKEN_ENV, "sla_minutes": 1, **api}
    with running_service(tmp_path, monkeypatch, api=settings) as svc:
        yield svc


def _connect(svc: Service) -> socket.socket:
    host, port = svc.url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or ``timeout``), and when it closed."""
    start = time.monotonic()
    s.settimeout(timeout)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            got += chunk
            s.settimeout(max(0.01, timeout - (time.monotonic() - start)))
    return got, time.monotonic() - start


def test_slow_headers_and_body_get_408_and_a_silent_socket_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _service(tmp_path, monkeypatch, header_timeout=1, body_timeout=1) as svc:
        silent, slow_head, slow_body = _connect(svc), _connect(svc), _connect(svc)
        slow_head.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ")
        slow_body.sendall(b"POST /api/v1/pause HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
                          b"Authorization: Bearer x\r\n\r\nab")  # fmt: skip
        results = {name: _read_until_closed(s, 6) for name, s in
                   (("silent", silent), ("head", slow_head), ("body", slow_body))}  # fmt: skip
        for s in (silent, slow_head, slow_body):
            s.close()
        assert results["silent"][0] == b""
        assert results["head"][0].startswith(b"HTTP/1.1 408 ")
        # the token is checked from the headers: the refusal comes at once, the body's deadline closes it
        assert results["body"][0].startswith((b"HTTP/1.1 408 ", b"HTTP/1.1 403 ", b"HTTP/1.1 401 "))
        held = 3.0 if _DEFERS else 0.0  # the kernel hands a silent connection over after about 3 s
        for name, (_, after) in results.items():
            assert after < 1 + 1.5 + (held if name == "silent" else 0.0), (name, after)
        assert svc.server.connections.timed_out >= 2
        assert httpx.get(f"{svc.url}/readyz").status_code == 200


def test_idle_keepalives_over_the_cap_make_room_for_a_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _service(tmp_path, monkeypatch, max_connections=8, keep_alive_timeout=30) as svc:
        cap = svc.server.connections.cap
        assert cap == 8
        clients = [httpx.Client(base_url=svc.url, timeout=5) for _ in range(3 * cap)]
        try:
            for c in clients:  # each one's connection stays open, idle, after its answer
                assert c.get("/healthz").status_code == 200
            assert svc.server.connections.evicted >= 2 * cap
            assert httpx.get(f"{svc.url}/readyz", timeout=5).status_code == 200
            for c in clients:  # an evicted keep-alive is reopened by the client: nobody sees an error
                assert c.get("/healthz").status_code == 200
        finally:
            for c in clients:
                c.close()


def test_slow_sockets_at_the_cap_never_lock_out_a_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _service(tmp_path, monkeypatch, max_connections=8, header_timeout=30) as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        with FloodProcess(port, count=40, drip=0.5, duration=30) as flood:
            wait_until(lambda: flood.opened >= 40, 20, "the slow sockets to connect")
            statuses = [_get(port, "/readyz") for _ in range(20)]
        assert statuses == [200] * 20
        assert svc.server.connections.evicted > 0 and svc.server.connections.refused == 0


@pytest.mark.skipif(not _DEFERS, reason="the kernel holds a silent connection back only where TCP_DEFER_ACCEPT exists")
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_probe_that_connects_and_then_stalls_outlives_a_burst_of_slow_sockets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: str
) -> None:
    # A prober descheduled between its connect and its request: the server must not take it for an idle
    # slow socket and evict it when a burst of slow sockets arrives meanwhile. The promise holds while the
    # kernel holds the silent probe back (``_HOLD_SILENT``); past that it is a silent socket like any other.
    # The test lengthens the hold, so that a loaded machine (the burst is sent and served in this process)
    # cannot stretch the probe's silence past it.
    _use_loop(monkeypatch, loop)
    hold = 30
    monkeypatch.setattr(connections_module, "_HOLD_SILENT", hold)
    with _service(tmp_path, monkeypatch, max_connections=8) as svc:
        stats = svc.server.connections
        probe = _connect(svc)
        connected = time.monotonic()
        time.sleep(0.1)
        burst = []
        for _ in range(3 * stats.cap):
            burst.append(_connect(svc))
            burst[-1].sendall(b"G")
        wait_until(lambda: stats.evicted >= stats.cap, 10, "the burst to evict idle connections")
        assert time.monotonic() - connected < hold  # still within the kernel's hold on the silent probe
        probe.sendall(_PROBE)
        got, _ = _read_until_closed(probe, 5)
        for s in (probe, *burst):
            s.close()
        assert got.startswith(b"HTTP/1.1 200 "), got[:80]


def _use_loop(monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    """Serve on uvloop (installed with the service extra) or on asyncio's own loop (where it is not)."""
    if loop == "asyncio":
        monkeypatch.setattr(server_module, "_new_loop", asyncio.new_event_loop)


def test_a_client_that_never_reads_is_cut_after_send_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _service(tmp_path, monkeypatch, send_timeout=1) as svc:
        stats = svc.server.connections
        size = len(httpx.get(f"{svc.url}/api/v1/openapi.json").content)
        wait_until(lambda: stats.open == 0, 10, "the size probe's connection to close")
        s = _connect(svc)
        count = (16 << 20) // size + 1  # more than the socket buffers hold
        s.sendall(b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * count)  # and read nothing
        started = time.monotonic()
        wait_until(lambda: stats.timed_out == 1 and stats.open == 0, 15, "the stalled connection to be cut")
        assert time.monotonic() - started < 1 + 3  # send_timeout from the first stall, plus the check's tick
        got = s.recv(65536)
        s.close()
        assert got.startswith(b"HTTP/1.1 200 ")
        assert httpx.get(f"{svc.url}/readyz").status_code == 200


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(5000)) + b"\r\n",
        b"GET /healthz HTTP/1.1\r\nX-Big: " + b"v" * (4 << 20) + b"\r\n\r\n",
        b"GET /" + b"a" * (4 << 20) + b" HTTP/1.1\r\n\r\n",
    ],
    ids=["thousands-of-headers", "enormous-header-line", "enormous-url"],
)
def test_an_oversized_request_head_gets_431(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: bytes) -> None:
    with _service(tmp_path, monkeypatch) as svc:
        s = _connect(svc)
        with contextlib.suppress(OSError):  # the server may close before it has all of it
            s.sendall(head)
        got, _ = _read_until_closed(s, 10)
        s.close()
        assert got.startswith(b"HTTP/1.1 431 "), got[:80]
        assert svc.server.connections.too_large == 1
        assert httpx.get(f"{svc.url}/healthz").status_code == 200


def test_event_streams_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _service(tmp_path, monkeypatch, max_event_streams=2) as svc:
        http = httpx.Client(base_url=svc.url, timeout=10)
        with http.stream("GET", "/api/v1/events") as one, http.stream("GET", "/api/v1/events") as two:
            frames = [stream.iter_text() for stream in (one, two)]  # kept: a dropped iterator closes its stream
            assert all(next(f).startswith("event: hello") for f in frames)
            third = http.get("/api/v1/events")
            assert third.status_code == 503 and third.headers["retry-after"] == "5"
        wait_until(lambda: _first_frame(http), 10, "a stream slot to be free again")
        http.close()


def _first_frame(http: httpx.Client) -> bool:
    with http.stream("GET", "/api/v1/events") as stream:
        frames = stream.iter_text()
        return stream.status_code == 200 and next(frames).startswith("event: hello")


@pytest.mark.parametrize(
    ("key", "value"),
    [("header_timeout", float("inf")), ("max_connections", 2), ("backlog", True), ("max_headers", 1.5),
     ("send_timeout", -1), ("keep_alive_timeout", "5")],
)  # fmt: skip
def test_api_bounds_are_validated(key: str, value: object) -> None:
    from ferry.service.config import parse_api
    from ferry.shard_tools.errors import ConfigError

    with pytest.raises(ConfigError, match=f"api.{key}"):
        parse_api({key: value})
    assert parse_api({key: getattr(ApiConfig, key)}) == ApiConfig()


def test_the_cap_leaves_half_the_descriptors_to_the_daemon() -> None:
    from ferry.service.api.connections import effective_max_connections

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = effective_max_connections(10**6, 128)
    assert soft == resource.RLIM_INFINITY or cap <= (soft - 128) // 2
