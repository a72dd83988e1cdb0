"""Per-thread kept-alive HTTP(S) connections and upload buffers for the presigned-PUT path.

Each transfer thread keeps one connection per (scheme, host) and one chunk buffer, so a shard's
PUT costs neither a TCP/TLS handshake nor a fresh allocation (zeroing, page faults) of its buffer.

Kept beside httpx: measured to spend less client CPU per PUT than an ``httpx.Client`` pool (docs/BENCHMARKS.md, Scale).
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
import threading
import urllib.parse

__all__ = ["connection", "drop", "chunk_buffer"]

_local = threading.local()


def chunk_buffer(chunk: int) -> bytearray:
    """This thread's upload buffer of at least ``chunk`` bytes (reused from shard to shard)."""
    buf: bytearray | None = getattr(_local, "buffer", None)
    if buf is None or len(buf) < chunk:
        buf = _local.buffer = bytearray(chunk)
    return buf


def _pool() -> dict[tuple[str, str], http.client.HTTPConnection]:
    pool: dict[tuple[str, str], http.client.HTTPConnection] = _local.__dict__.setdefault("pool", {})
    return pool


def connection(u: urllib.parse.SplitResult) -> http.client.HTTPConnection:
    """This thread's kept-alive connection to ``u``'s host; a connection the server closed is replaced."""
    pool = _pool()
    key = (u.scheme, u.netloc)
    conn = pool.get(key)
    if conn is not None and conn.sock is not None and _readable_now(conn.sock):
        conn.close()  # readable while idle: the server closed it (or sent something unasked)
    if conn is None:
        if u.scheme == "https":
            context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
            conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=300, context=context)
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=300)
        pool[key] = conn
    return conn


def drop(u: urllib.parse.SplitResult, conn: http.client.HTTPConnection) -> None:
    """Close ``conn`` and forget it (a request on it failed half-way: it cannot be reused)."""
    conn.close()
    pool = _pool()
    if pool.get((u.scheme, u.netloc)) is conn:
        del pool[(u.scheme, u.netloc)]


def _readable_now(sock: socket.socket) -> bool:
    """True when ``sock`` has something to read right now. poll(), not select(): select() refuses
    descriptors ≥ FD_SETSIZE (1024), which a busy daemon's sockets reach."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])  # Windows: no poll(), and no FD_SETSIZE limit of that kind
