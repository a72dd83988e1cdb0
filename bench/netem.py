"""Network conditions on loopback: an HTTP/1.1 proxy in front of an S3 endpoint (moto) that adds a round
trip per request, caps bandwidth per connection and in total, and can hang or corrupt chosen requests.

    with moto_server() as upstream, Netem(upstream, rtt=0.03) as net:
        opts = {"client_kwargs": {"endpoint_url": net.url}, "key": "testing", "secret": "testing"}
        ...
        net.hang(lambda r: "/replica-a/" in r.path, count=1000)  # accept, never answer
        print(net.requests)  # what went through: method, path, range, status, body bytes

Everything binds 127.0.0.1. The proxy runs its own event loop in a daemon thread and stops when the
``with`` ends or after ``lifetime`` seconds, whichever comes first; hung requests are held only until
the client gives up (closes) or the proxy stops. Bandwidth is token buckets (per connection and one
shared); the round trip is added once per request before its response starts (the client sees its
first byte ``rtt`` later than it would). Used by the remote tests and ``bench/suite_remote.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Netem", "Request", "moto_server", "free_port", "wait_for_port"]

_CHUNK = 64 << 10
_HEAD_LIMIT = 64 << 10
_IDLE_S = 60.0  # a client connection idle this long is closed


@dataclass
class Request:
    """One request that went through the proxy (appended when its response ends or it is dropped)."""

    method: str
    path: str
    range: str | None
    status: int = 0
    body_bytes: int = 0
    hung: bool = False
    corrupted: bool = False
    started: float = 0.0
    ended: float = 0.0


Match = Callable[[Request], bool]


class _Bucket:
    """A token bucket of ``rate`` bytes/s (0: unlimited) with a burst of 20 ms of traffic (or one chunk)."""

    def __init__(self, rate: float) -> None:
        self.rate = float(rate)
        self.burst = max(_CHUNK, self.rate * 0.02)
        self.tokens = self.burst
        self.stamp = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        for _ in range(100_000):  # bounded: each round waits for the missing tokens
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= n:
                self.tokens -= n
                return
            await asyncio.sleep((n - self.tokens) / self.rate)


class _Rule:
    def __init__(self, match: Match, count: int) -> None:
        self.match, self.left = match, count


def _matcher(match: str | Match) -> Match:
    if isinstance(match, str):
        return lambda r: match in r.path
    return match


class Netem:
    """The proxy; ``url`` is its endpoint. All settings may be changed while it runs."""

    def __init__(
        self,
        upstream: str,
        *,
        rtt: float = 0.030,
        conn_rate: float = 40e6,
        total_rate: float = 200e6,
        lifetime: float = 600.0,
    ) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"netem proxies loopback only, got {upstream}")
        self.upstream = ("127.0.0.1", int(port or 80))
        self.rtt, self.conn_rate, self.total_rate, self.lifetime = rtt, conn_rate, total_rate, lifetime
        self.requests: list[Request] = []
        self._hangs: list[_Rule] = []
        self._corrupts: list[_Rule] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._total: _Bucket | None = None
        self._relaying = 0  # responses being relayed now (not hung): see clear()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hang(self, match: str | Match, count: int = 1) -> None:
        """The next ``count`` requests matching (a path substring or a predicate) are accepted, never answered."""
        with self._lock:
            self._hangs.append(_Rule(_matcher(match), count))

    def corrupt(self, match: str | Match, count: int = 1) -> None:
        """The next ``count`` matching responses get one byte of their body flipped (in the middle)."""
        with self._lock:
            self._corrupts.append(_Rule(_matcher(match), count))

    def clear(self, settle: float = 2.0) -> None:
        """Forget the requests seen and the rules. First the responses being relayed end (within ``settle``
        seconds): a client may hold a whole body before the proxy, in its own thread, records the request."""
        deadline = time.monotonic() + settle
        for _ in range(10_000):  # bounded in count and in time
            if not self._relaying or time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        with self._lock:
            self._hangs.clear()
            self._corrupts.clear()
            self.requests.clear()

    def count(self, match: str | Match, method: str = "GET") -> int:
        """Requests seen so far (hung ones included) whose path matches."""
        m = _matcher(match)
        with self._lock:
            return sum(1 for r in self.requests if r.method == method and m(r))

    def body_bytes(self, match: str | Match = "") -> int:
        m = _matcher(match)
        with self._lock:
            return sum(r.body_bytes for r in self.requests if m(r))

    def _take(self, rules: list[_Rule], req: Request) -> bool:
        with self._lock:
            for rule in rules:
                if rule.left > 0 and rule.match(req):
                    rule.left -= 1
                    return True
        return False

    # --- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> Netem:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="netem", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("netem proxy did not start within 10 s")

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._total = _Bucket(self.total_rate)
        tasks: set[asyncio.Task[None]] = set()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._serve(reader, writer)
            finally:
                tasks.discard(task)
                writer.close()

        server = await asyncio.start_server(on_client, "127.0.0.1", 0, backlog=512)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.lifetime)
        finally:
            server.close()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- one client connection -------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        bucket = _Bucket(self.conn_rate)
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            for _ in range(1_000_000):  # requests on one keep-alive connection
                head = await _read_head(reader, _IDLE_S)
                if head is None:
                    return
                up = await self._one(head, reader, writer, bucket, up)
                if up is None:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            return
        finally:
            if up is not None:
                up[1].close()

    async def _one(
        self,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        bucket: _Bucket,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Relay one request; the upstream connection to reuse, or None to close the client's."""
        method, path, headers = _parse_head(head)
        req = Request(method, path, headers.get("range"), started=time.monotonic())
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        if self._take(self._hangs, req):
            req.hung = True
            self._record(req)
            # accept, never answer: hold until the client gives up or the proxy stops
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(reader.read(1), self.lifetime)
            return None
        self._relaying += 1  # the loop's thread only
        try:
            return await self._relay(req, head, body, writer, bucket, up)
        finally:
            self._relaying -= 1

    async def _relay(
        self,
        req: Request,
        head: bytes,
        body: bytes,
        writer: asyncio.StreamWriter,
        bucket: _Bucket,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Send the request upstream and its answer back (through the buckets), then record it."""
        if self.rtt > 0:
            await asyncio.sleep(self.rtt)
        if up is None:
            up = await asyncio.open_connection(*self.upstream)
        up[1].write(head + body)
        await up[1].drain()
        status_head = await _read_head(up[0], _IDLE_S)
        if status_head is None:
            raise ConnectionError("upstream closed")
        status, rheaders = _parse_status(status_head)
        req.status = status
        writer.write(status_head)
        corrupt = self._take(self._corrupts, req)
        keep = await self._relay_body(up[0], writer, bucket, rheaders, req.method, req, corrupt)
        req.corrupted = corrupt
        req.ended = time.monotonic()
        self._record(req)
        if not keep:
            up[1].close()
            return None
        return up

    async def _relay_body(
        self,
        up: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        bucket: _Bucket,
        headers: dict[str, str],
        method: str,
        req: Request,
        corrupt: bool,
    ) -> bool:
        """Stream the response body through the buckets; whether both connections can be kept."""
        length = 0 if method == "HEAD" or req.status in (204, 304) else int(headers.get("content-length", "-1"))
        if length < 0:  # no length (chunked or close-delimited): not used by S3 GETs; relay raw until EOF
            data = await up.read()
            await self._send(writer, bucket, data)
            req.body_bytes = len(data)
            return False
        flip = length // 2 if corrupt and length else -1
        sent = 0
        for _ in range(length // _CHUNK + 2):
            if sent >= length:
                break
            chunk = await up.readexactly(min(_CHUNK, length - sent))
            if sent <= flip < sent + len(chunk):
                b = bytearray(chunk)
                b[flip - sent] ^= 0xFF
                chunk = bytes(b)
            await self._send(writer, bucket, chunk)
            sent += len(chunk)
        req.body_bytes = sent
        return headers.get("connection", "").lower() != "close"

    async def _send(self, writer: asyncio.StreamWriter, bucket: _Bucket, data: bytes) -> None:
        assert self._total is not None
        bucket.rate, self._total.rate = float(self.conn_rate), float(self.total_rate)
        for i in range(0, len(data), _CHUNK):
            piece = data[i : i + _CHUNK]
            await bucket.take(len(piece))
            await self._total.take(len(piece))
            writer.write(piece)
            await writer.drain()

    def _record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)


async def _read_head(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
    """One HTTP head (through the blank line), None at a clean EOF."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    except asyncio.LimitOverrunError as exc:
        raise ValueError("HTTP head too long") from exc
    if len(head) > _HEAD_LIMIT:
        raise ValueError("HTTP head too long")
    return head


def _headers(lines: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        out[name.strip().lower()] = value.strip()
    return out


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    method, path, _ = lines[0].decode("latin-1").split(" ", 2)
    headers = _headers(lines[1:])
    if "chunked" in headers.get("transfer-encoding", ""):
        raise ValueError("chunked request bodies are not relayed")
    return method, path, headers


def _parse_status(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    return int(lines[0].split(b" ", 2)[1]), _headers(lines[1:])


# --- a moto server for the benchmark (tests use conftest's moto_endpoint) ------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@contextlib.contextmanager
def moto_server(python: str = sys.executable, *, ranged: bool = True) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the ``with`` block; yields its endpoint URL. ``ranged``: a ranged
    GET reads only its range, as S3 does (``moto_ranged.py``); moto as shipped reads the whole object."""
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env.pop("AWS_CA_BUNDLE", None)
    server = [str(Path(__file__).with_name("moto_ranged.py"))] if ranged else ["-m", "moto.server"]
    proc = subprocess.Popen(
        [python, *server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
