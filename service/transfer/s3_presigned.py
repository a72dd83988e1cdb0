"""A local shard to S3 as one presigned PUT, streamed by the transfer thread from one reused buffer.

s3fs sends every body through aiobotocore/aiohttp on its one event-loop thread, which joins
and buffers it in Python; a presigned URL (made by s3fs, so endpoint, region, addressing and
credentials are its own) lets each transfer thread send its chunks itself. The last chunk goes
out only after every byte read matched the manifest's size and digest: otherwise the connection
is closed with the body short of its Content-Length and the store keeps nothing. Unless the copy
is a repair, the PUT carries ``If-None-Match: *``: the store refuses it (412) where an object
already has the name, and keeps that object.
"""

from __future__ import annotations

import http.client
import io
import os
import threading
import urllib.parse
import weakref

from ferry.shard_tools.errors import ShardFormatError, SourceMissing, StorageError
from ferry.shard_tools.format.digest import Hasher
from ferry.shard_tools.storage.store import Location

from . import http_pool
from .hashed_io import CopySpec, NameTaken, check_cancel, check_digest

__all__ = ["presign_allowed", "put_presigned", "open_local_source"]

PRESIGN_EXPIRES = 900  # seconds a presigned URL stays valid: far longer than one shard's PUT
# Filesystems whose store refused a presigned PUT (e.g. a redirect to the bucket's region): they
# upload through s3fs from then on. Kept beside the filesystem (by identity: fsspec instances with
# equal options compare equal, yet only the refused instance's URLs were refused), not on it.
_refused: dict[int, weakref.ref[object]] = {}
_refused_lock = threading.Lock()


def _was_refused(fs: object) -> bool:
    with _refused_lock:
        ref = _refused.get(id(fs))
        return ref is not None and ref() is fs


def _refuse(fs: object) -> None:
    key = id(fs)
    with _refused_lock:
        _refused[key] = weakref.ref(fs, lambda _: _refused.pop(key, None))


def presign_allowed(fs: object) -> bool:
    """Whether uploads to ``fs`` may go as presigned PUTs (s3fs with nothing a presigned PUT would drop)."""
    if "s3" not in getattr(fs, "protocol", ()) or not hasattr(fs, "url"):
        return False
    if _was_refused(fs):
        return False
    s3_config = (getattr(fs, "config_kwargs", None) or {}).get("s3") or {}
    return (
        not getattr(fs, "s3_additional_kwargs", None)  # SSE, ACL, …: headers a presigned PUT would not carry
        and not s3_config.get("payload_signing_enabled")  # the user asked for signed bodies
        and "verify" not in (getattr(fs, "client_kwargs", None) or {})  # custom TLS verification: s3fs's
    )


def open_local_source(src: Location, c: CopySpec) -> io.FileIO:
    """The local source shard, unbuffered, after checking its size against the manifest."""
    try:
        f = open(src.full(c.path), "rb", buffering=0)  # noqa: SIM115 - the caller closes it
    except FileNotFoundError as exc:
        raise SourceMissing(str(exc)) from exc
    actual = os.fstat(f.fileno()).st_size
    if actual != c.size:
        f.close()
        raise ShardFormatError(c.path, f"source holds {actual} bytes, manifest says {c.size}")
    return f


def put_presigned(src: Location, dst: Location, c: CopySpec) -> bool:
    """PUT the local shard to ``dst``; False when the store refused the presigned PUT (the caller
    then uses s3fs, and so does every later upload to this filesystem); NameTaken when a create-only
    PUT found an object at the name (412, or 409 while another create of it runs). Memory: one chunk
    per thread.
    """
    fs = dst.fs
    target = dst.full(c.path)
    u = urllib.parse.urlsplit(fs.url(target, expires=PRESIGN_EXPIRES, client_method="put_object"))
    with open_local_source(src, c) as f:
        conn = http_pool.connection(u)
        view = memoryview(http_pool.chunk_buffer(c.chunk))
        try:
            status, reason = _stream_put(conn, u, f, view[: c.chunk], c)
        except BaseException:
            http_pool.drop(u, conn)  # the body is short of its Content-Length: the PUT cannot complete
            raise
        finally:
            view.release()
    if 200 <= status < 300:
        fs.invalidate_cache(target)
        return True
    http_pool.drop(u, conn)
    if c.create_only and status in (409, 412):
        fs.invalidate_cache(target)
        raise NameTaken(target)
    if status >= 500 or status in (408, 429):
        raise StorageError(f"PUT of {target}: HTTP {status} {reason}")
    _refuse(fs)
    return False


def _stream_put(
    conn: http.client.HTTPConnection, u: urllib.parse.SplitResult, f: io.RawIOBase, buf: memoryview, c: CopySpec
) -> tuple[int, str]:
    """Send the request and the body from ``f`` (the last piece only once verified); (status, reason)."""
    path, size, digest, _, throttle, progress, cancel, create_only = c
    hasher = Hasher()
    try:
        conn.putrequest("PUT", f"{u.path}?{u.query}", skip_accept_encoding=True)
        conn.putheader("Content-Length", str(size))
        if create_only:
            conn.putheader("If-None-Match", "*")  # not signed: a presigned URL lets the client add it
        conn.endheaders()
        last = 0
        while hasher.nbytes < size:
            check_cancel(cancel)
            n = f.readinto(buf[: size - hasher.nbytes])
            if not n:
                break
            throttle(n)
            hasher.update(buf[:n])
            if hasher.nbytes < size:
                conn.send(buf[:n])
                progress(n)
            else:
                last = n
        check_digest(hasher, path, size, digest)  # raises on a short or corrupt read: the last piece stays here
        if last:
            conn.send(buf[:last])
            progress(last)
    except OSError as exc:
        early = _early_response(conn)  # a store may answer (and close) before reading the whole body
        if early is None:
            raise StorageError(f"PUT of {path} failed: {exc}") from exc
        return early
    try:
        resp = conn.getresponse()
        resp.read()  # drained for the kept-alive connection; not quoted: S3 error bodies can name the key id
    except (OSError, http.client.HTTPException) as exc:
        raise StorageError(f"PUT of {path} failed: {exc}") from exc
    return resp.status, resp.reason


def _early_response(conn: http.client.HTTPConnection) -> tuple[int, str] | None:
    try:
        resp = conn.getresponse()
        resp.read()
    except (OSError, http.client.HTTPException):
        return None
    return resp.status, resp.reason
