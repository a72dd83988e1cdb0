"""The API's HTTP connections: bounded in number, in time and in size, so clients cannot starve the daemon.

uvicorn accepts every connection and waits for a request as long as the client likes: a few hundred
sockets sending their headers a byte at a time hold as many file descriptors, and once the process
runs out the daemon's own copies fail to open files. ``guarded_protocol()`` makes uvicorn's
httptools protocol class with these bounds:

- **connections**: at most ``max_connections`` sockets (never more than half the descriptors
  ``RLIMIT_NOFILE`` leaves beyond the listen backlog). A connection over the cap evicts the
  connection idle longest (one waiting for its request's headers, or a keep-alive between
  requests); when every connection is busy with a request, the newcomer is answered 503 at once.
  On Linux the kernel hands a connection over only once its first bytes arrive (``defer_accept``),
  and a new connection is read before a burst can evict it (see ``_Pool.make_room``), so a health
  probe finds a slot and keeps it while slow clients hold the rest, even when it is slow to send
  its request after its connect.
- **time**: a request's line and headers must arrive within ``header_timeout`` of its first byte
  (of its acceptance, for a connection's first request), its body within ``body_timeout`` of its headers
  (408 then), and a response whose bytes do not move for ``send_timeout`` (a client that reads
  nothing) is cut; an idle keep-alive closes after ``keep_alive_timeout`` (uvicorn's own timer).
- **size**: at most ``max_header_bytes`` of request line and headers and ``max_headers`` header
  lines (431 beyond either), checked as bytes arrive, before an enormous line is buffered whole.

One timer per server checks the deadlines of every open connection a few times a second
(O(open connections), at most ``max_connections``); eviction is O(1) (idle connections are kept
in the order they went idle).
"""

from __future__ import annotations

import asyncio
import resource
import socket
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import ApiConfig

__all__ = ["ConnectionStats", "defer_accept", "effective_max_connections", "guarded_protocol"]


def _canned(status: str, body: str, *extra: str) -> bytes:
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", f"content-length: {len(body) + 1}",
            *extra, "connection: close"]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n" + body + "\n").encode()


_HOLD_SILENT = 3  # seconds the kernel holds a silent new connection back (rounded up to its SYN-ACK retries)

_408 = _canned("408 Request Timeout", "request timeout: the request did not arrive in time")
_431 = _canned("431 Request Header Fields Too Large", "request line and headers over the server's limits")
_503 = _canned("503 Service Unavailable", "too many connections: retry shortly", "retry-after: 1")


def effective_max_connections(configured: int, backlog: int) -> int:
    """``configured``, lowered so that API sockets (and the backlog accepted in one go) use at most half
    of the descriptors the process may open: the other half stays for the daemon's files and storage."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(8, min(configured, (soft - backlog) // 2))


@dataclass
class ConnectionStats:
    """What the connection guard did since the server started (read by tests and operators)."""

    cap: int = 0
    backlog: int = 0
    open: int = 0  # connections holding a slot now
    accepted: int = 0
    evicted: int = 0  # idle connections closed to make room for a new one
    refused: int = 0  # new connections answered 503 (every slot busy)
    timed_out: int = 0  # headers or body too slow (408), or a response unsent for send_timeout
    too_large: int = 0  # 431

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Pool:
    """State shared by one server's connections (touched on its event loop only)."""

    settings: ApiConfig
    cap: int
    tick: float
    stats: ConnectionStats
    live: dict[GuardedHttpProtocol, None] = field(default_factory=dict)
    idle: dict[GuardedHttpProtocol, None] = field(default_factory=dict)  # oldest first
    timer: asyncio.TimerHandle | None = None

    def make_room(self) -> bool:
        """Below the cap, or evict the longest-idle connection to get there; False when all are busy.

        uvloop reads each new connection as it accepts it; asyncio's loop accepts up to a backlog before
        it reads any, and there the backlog is at most half the cap. Either way a burst cannot evict a
        health probe before its request, already in its socket, is read.
        """
        if len(self.live) < self.cap:
            return True
        if not self.idle:
            return False
        next(iter(self.idle)).drop()
        self.stats.evicted += 1
        return True

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.timer is None:
            self.timer = loop.call_later(self.tick, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self.timer = None
        now = time.monotonic()
        for conn in list(self.live):
            conn.check(now)
        if self.live:
            self.watch(loop)


class _CountingTransport:
    """The connection's transport, counting the bytes handed to it (so a stalled send is visible)."""

    __slots__ = ("_transport", "written")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._transport.is_closing():  # cut (a stalled send, an eviction): a late response goes nowhere
            return
        self.written += len(data)
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ferry's connection bounds (``guarded_protocol`` makes one per server)."""

    pool: ClassVar[_Pool]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._deadline: float | None = None  # headers (or body) must be in by then
        self._in_head = True  # between requests or inside one's request line and headers
        self._head_bytes = 0
        self._header_count = 0
        self._counting: _CountingTransport | None = None
        self._drained = 0
        self._stalled_since: float | None = None

    # -- connection life ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        pool = self.pool
        if not pool.make_room():
            self._refused = True
            pool.stats.refused += 1
            transport.write(_503)
            transport.close()
            return
        pool.stats.accepted += 1
        self._counting = _CountingTransport(transport)
        super().connection_made(self._counting)  # type: ignore[arg-type]
        pool.live[self] = None
        pool.idle[self] = None
        pool.stats.open = len(pool.live)
        self._deadline = time.monotonic() + pool.settings.header_timeout
        pool.watch(self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self.pool.live.pop(self, None)
        self.pool.idle.pop(self, None)
        self.pool.stats.open = len(self.pool.live)
        super().connection_lost(exc)

    def drop(self) -> None:
        """Close now, unsent bytes and all (eviction, a stalled send)."""
        self.pool.idle.pop(self, None)
        self.pool.live.pop(self, None)  # its slot is free at once; connection_lost follows
        self.pool.stats.open = len(self.pool.live)
        self.transport.abort()

    def _answer_and_close(self, response: bytes) -> None:
        self.pool.idle.pop(self, None)
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()

    # -- deadlines, checked by the pool's timer ----------------------------------------------------
    def check(self, now: float) -> None:
        if self._deadline is not None and now > self._deadline:
            self.pool.stats.timed_out += 1
            if self._head_bytes or not self._in_head:  # part of a request came: say why it is closed
                self._answer_and_close(_408)
            else:
                self._deadline = None
                self.drop()
            return
        transport = self.transport
        unsent = transport.get_write_buffer_size()
        if not unsent:
            self._stalled_since = None
            return
        assert self._counting is not None
        drained = self._counting.written - unsent
        if drained != self._drained or self._stalled_since is None:
            self._drained, self._stalled_since = drained, now
        elif now - self._stalled_since > self.pool.settings.send_timeout:
            self.pool.stats.timed_out += 1
            self.drop()

    # -- bytes in ----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _TooLarge):
                self._too_large()
                return
            self._invalid()
            return
        except httptools.HttpParserError:
            self._invalid()
            return
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
            return
        if self._in_head and self._deadline is not None:
            self._head_bytes += len(data)
            if self._head_bytes > self.pool.settings.max_header_bytes:
                self._too_large()

    def _invalid(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.pool.idle.pop(self, None)
        self._deadline = None
        self.send_400_response(msg)

    def _too_large(self) -> None:
        self.pool.stats.too_large += 1
        self._answer_and_close(_431)

    def on_message_begin(self) -> None:
        if self._deadline is None:  # the first byte of a keep-alive connection's next request
            self._deadline = time.monotonic() + self.pool.settings.header_timeout
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > self.pool.settings.max_header_bytes:
            raise _TooLarge
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.pool.settings.max_headers:
            raise _TooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = self._header_count = 0
        self.pool.idle.pop(self, None)
        self._deadline = time.monotonic() + self.pool.settings.body_timeout
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._deadline = None
        self._in_head = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and self in self.pool.live:
            self.pool.idle.pop(self, None)
            self.pool.idle[self] = None  # idle again: the newest


def defer_accept(sock: Any) -> bool:
    """Where the platform has it (Linux), have the kernel hand ``sock``'s new connections over only once
    their first bytes arrive, or after ``_HOLD_SILENT`` seconds of silence: a new connection is accepted with
    its request already readable, and a silent one holds no descriptor meanwhile. False where unsupported.
    The kernel can hold back only as many as the listen backlog; past that it answers with SYN cookies
    and hands connections over at once."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, _HOLD_SILENT)
    except OSError:
        return False
    return True


class _TooLarge(Exception):
    """Raised from a parser callback: the request's head is over a limit."""


def guarded_protocol(
    settings: ApiConfig, *, reads_each_accept: bool = False
) -> tuple[type[GuardedHttpProtocol], ConnectionStats]:
    """A protocol class for one uvicorn server under ``settings``' bounds, and the stats it keeps (with
    the connection cap and the listen backlog to use).

    ``reads_each_accept``: the loop handles each connection as it accepts it (uvloop), so the whole
    ``[api] backlog`` is used, which the cap already leaves out of the descriptors. asyncio's loop
    accepts up to a backlog of connections before it handles any, each holding a descriptor until
    then: there the backlog is at most half the cap."""
    cap = effective_max_connections(settings.max_connections, settings.backlog)
    backlog = settings.backlog if reads_each_accept else max(1, min(settings.backlog, cap // 2))
    stats = ConnectionStats(cap=cap, backlog=backlog)
    shortest = min(settings.header_timeout, settings.body_timeout, settings.send_timeout)
    pool = _Pool(settings=settings, cap=cap, tick=min(0.5, max(0.05, shortest / 4)), stats=stats)
    cls: type[GuardedHttpProtocol] = type("FerryHttpProtocol", (GuardedHttpProtocol,), {"pool": pool})
    return cls, stats
