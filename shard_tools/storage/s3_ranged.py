"""Ranged S3 GETs over kept-alive ``http.client`` connections, one per thread, without botocore or an event loop.

For the plain settings :func:`ferry.shard_tools.storage.s3_get.plan_s3_get` handles (it says None for the rest,
and those reads stay with fsspec). A read answers only what it can vouch for: a ``206`` whose ``Content-Range``
starts where it asked and whose body is whole; anything else (an error status, a cut connection, an odd header)
is ``None``, and the caller reads the same bytes through fsspec, which names the error or retries as botocore does.

Kept beside s3fs: filling shards through it costs about half the CPU of s3fs's ranged reads, and a loader's
DataLoader workers build their batches beside it (docs/BENCHMARKS.md, Remote).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .s3_get import S3Get, connect, plan_s3_get, sign_v4

__all__ = ["S3Root", "RangedGet", "plan_root"]

#: seconds to connect, and then the bound on one silent wait for bytes (the loader's deadlines hedge far sooner)
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 60.0
_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
# a kept-alive connection the server closed meanwhile: the request is sent once more, on a new connection
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_local = threading.local()


@dataclass(frozen=True)
class S3Root:
    """How to GET the objects under one ``s3://bucket/prefix`` root (planned once per dataset root)."""

    base: S3Get  # a GET of the object named ``_PROBE`` under the root
    prefix: str  # ``base.path`` without that name

    def get(self, rel: str) -> S3Get:
        """The GET of object ``rel`` (a path relative to the root)."""
        return replace(self.base, path=self.prefix + urllib.parse.quote(rel, safe="/~"))


_PROBE = "o"


def plan_root(url: str, options: Mapping[str, Any], env: Mapping[str, str]) -> S3Root | None:
    """How to GET objects under dataset root ``url`` (``s3://bucket[/prefix]``), or None where fsspec must."""
    root = url.split("?", 1)[0].rstrip("/")
    if not root.startswith(("s3://", "s3a://")):
        return None
    get = plan_s3_get(f"{root}/{_PROBE}", options, env)
    if get is None or not get.path.endswith("/" + _PROBE):
        return None
    return S3Root(get, get.path[: -len(_PROBE)])


def _connection(get: S3Get, fresh: bool) -> http.client.HTTPConnection:
    """This thread's kept-alive connection to ``get``'s host (a new one if ``fresh``, or after a fork)."""
    pid = os.getpid()
    conns: dict[tuple[str, str], http.client.HTTPConnection] = getattr(_local, "conns", {})
    if getattr(_local, "pid", pid) != pid:
        conns = {}  # a child's thread-local copies belong to the parent's sockets
    _local.pid, _local.conns = pid, conns
    key = (get.scheme, get.host)
    conn = conns.get(key)
    if conn is not None and not fresh:
        return conn
    if conn is not None:
        conn.close()
    conn = conns[key] = connect(get, CONNECT_TIMEOUT_S)
    return conn


def _forget(get: S3Get) -> None:
    conn = getattr(_local, "conns", {}).pop((get.scheme, get.host), None)
    if conn is not None:
        conn.close()


class RangedGet:
    """One GET of bytes ``[start, end)`` of an object (fewer where the object ends first), run by :meth:`run` in a
    thread and abandoned from any other by :meth:`abort`."""

    def __init__(self, get: S3Get, start: int, end: int) -> None:
        if not 0 <= start < end:
            raise ValueError(f"bad span {(start, end)}")
        self.get, self.start, self.end = get, start, end
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.aborted = False
        self.status: int | None = None  # the answer's HTTP status, once one came

    def abort(self) -> None:
        """Stop the read: its connection is shut down, so a wait for its bytes ends at once."""
        with self._lock:
            self.aborted = True
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> bytes | None:
        """The bytes, or None: not answered as asked (the caller reads them another way), or aborted."""
        try:
            return self._run()
        except (OSError, http.client.HTTPException, ValueError):
            _forget(self.get)
            return None

    def _run(self) -> bytes | None:
        headers = sign_v4(self.get, datetime.datetime.now(datetime.timezone.utc))
        headers["range"] = f"bytes={self.start}-{self.end - 1}"  # unsigned: SigV4 signs only the headers it names
        resp = self._exchange(headers)
        if resp is None:
            return None
        length = self._length(resp)
        if length is None:
            _forget(self.get)  # its body unread: the connection cannot carry another request
            return None
        body = resp.read(length)
        with self._lock:
            self._sock = None
        if len(body) != length or self.aborted:
            _forget(self.get)
            return None
        return body

    def _exchange(self, headers: dict[str, str]) -> http.client.HTTPResponse | None:
        """The response to the request, sent on this thread's connection (again on a new one if the server had
        closed the kept one)."""
        for fresh in (False, True):
            conn = _connection(self.get, fresh)
            reused = conn.sock is not None
            try:
                if conn.sock is None:
                    conn.connect()
                    if conn.sock is not None:
                        conn.sock.settimeout(READ_TIMEOUT_S)
                with self._lock:
                    if self.aborted:
                        return None
                    self._sock = conn.sock
                conn.request("GET", self.get.path, headers=headers)  # the signed Host header, not http.client's
                return conn.getresponse()
            except _STALE:
                if not reused or self.aborted:
                    raise
        return None  # not reached: the second round raises or returns

    def _length(self, resp: http.client.HTTPResponse) -> int | None:
        """The body's length when the response is the asked range, else None."""
        self.status = resp.status
        if resp.status != 206:
            return None
        match = _RANGE.fullmatch(resp.getheader("content-range") or "")
        size = resp.getheader("content-length")
        if match is None or size is None or not size.isdigit():
            return None
        first, last = int(match.group(1)), int(match.group(2))
        length = last - first + 1
        if first != self.start or length < 1 or length > self.end - self.start or int(size) != length:
            return None
        return length
