"""Object-store uploads to S3: one PUT for a shard that fits, multipart above, presigned or signed, memory bounded
(what every copy path guarantees, verification and create-only included: tests/contracts/copy_paths.py)."""

from __future__ import annotations

import os
import resource
import socket
import time
import tracemalloc
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import ferry.service.transfer.transfer as transfer
from ferry.service.transfer import http_pool, object_store, s3_presigned
from ferry.service.transfer.object_store import skip_double_checksums
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve


@pytest.fixture(autouse=True)
def _one_checksum() -> None:
    skip_double_checksums()  # as the daemon and `ferry sync` do before they open a store


def _shard(loc: Any, path: str, size: int) -> str:
    data = os.urandom(size)
    loc.write_bytes(path, data)
    return digest_bytes(data)


def _etag(dst: Any, bucket: str, key: str) -> str:
    return str(dst.fs.call_s3("head_object", Bucket=bucket, Key=key)["ETag"]).strip('"')


def test_small_shard_is_one_put_and_large_is_verified_multipart(
    file_backend: Any, s3_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = resolve(file_backend.url("ds"))
    dst = resolve(s3_backend.url("ds"), s3_backend.storage_options)
    bucket = s3_backend.base.split("://")[1]
    size = 6 * 2**20 + 3
    d = _shard(src, "shards/a.bin", size)
    transfer.copy_shard(src, dst, "shards/a.bin", size, d, chunk_size=2**20)
    assert "-" not in _etag(dst, bucket, "ds/shards/a.bin")  # a multipart ETag ends in -<parts>
    assert digest_bytes(dst.read_bytes("shards/a.bin")) == d

    # above the single-PUT size: multipart (completed only when the digest matched: tests/contracts/copy_paths.py)
    monkeypatch.setattr(object_store, "SINGLE_PUT_MAX", 5 * 2**20)
    size = 11 * 2**20 + 5
    d = _shard(src, "shards/b.bin", size)
    transfer.copy_shard(src, dst, "shards/b.bin", size, d, chunk_size=2**20)
    assert _etag(dst, bucket, "ds/shards/b.bin").endswith("-3")
    assert digest_bytes(dst.read_bytes("shards/b.bin")) == d


def _payload_hashes(dst: Any) -> list[str]:
    """Record the x-amz-content-sha256 header of every PutObject the client sends."""
    seen: list[str] = []

    def hook(request: Any, **_: Any) -> None:
        value = request.headers["X-Amz-Content-SHA256"]
        seen.append(value.decode() if isinstance(value, bytes) else value)

    dst.fs.connect(refresh=False)
    dst.fs.s3.meta.events.register("before-send.s3.PutObject", hook)
    return seen


def test_uploads_are_presigned_puts_by_default_and_signed_on_request(file_backend: Any, s3_backend: Any) -> None:
    src = resolve(file_backend.url("ds"))
    size = 2**20 + 7
    d = _shard(src, "shards/u.bin", size)
    signed = {"config_kwargs": {"s3": {"payload_signing_enabled": True}}}
    cases = (
        ("presigned", {}, []),  # the transfer thread PUTs to a presigned URL: botocore sends nothing
        ("signed", signed, ["sha256"]),  # asked for signed bodies: botocore's PutObject with the SHA-256
        ("extra-kwargs", {"s3_additional_kwargs": {"ACL": "private"}}, ["UNSIGNED-PAYLOAD"]),  # headers to keep
    )
    for name, extra, expected in cases:
        dst = resolve(s3_backend.url(f"ds-{name}"), {**s3_backend.storage_options, **extra})
        seen = _payload_hashes(dst)
        transfer.copy_shard(src, dst, "shards/u.bin", size, d, chunk_size=2**20)
        assert ["sha256" if len(h) == 64 else h for h in seen] == expected, (name, seen)
        assert digest_bytes(dst.read_bytes("shards/u.bin")) == d


def test_a_refused_presigned_put_falls_back_to_the_filesystem(
    file_backend: Any, s3_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = resolve(file_backend.url("ds"))
    dst = resolve(s3_backend.url("ds-fallback"), s3_backend.storage_options)
    size = 2**20 + 9
    d = _shard(src, "shards/f.bin", size)
    real_url = dst.fs.url
    bucket = s3_backend.base.split("://")[1]

    def elsewhere(path: str, **kw: Any) -> str:  # a URL the store refuses (404 NoSuchBucket)
        return str(real_url(path, **kw)).replace(f"/{bucket}/", "/no-such-bucket-here/")

    monkeypatch.setattr(dst.fs, "url", elsewhere)
    seen = _payload_hashes(dst)
    transfer.copy_shard(src, dst, "shards/f.bin", size, d, chunk_size=2**20)
    assert seen == ["UNSIGNED-PAYLOAD"]  # refused once, then s3fs's own PutObject, unsigned
    assert digest_bytes(dst.read_bytes("shards/f.bin")) == d
    assert not s3_presigned.presign_allowed(dst.fs)  # and later uploads go the s3fs way directly


def test_presigned_put_streams_with_memory_bounded_by_one_chunk(file_backend: Any, s3_backend: Any) -> None:
    """The single PUT is streamed from one reused chunk buffer, not the whole shard held in memory."""
    src = resolve(file_backend.url("ds"))
    dst = resolve(s3_backend.url("ds-stream"), s3_backend.storage_options)
    size, chunk = 24 * 2**20 + 11, 2**20
    d = _shard(src, "shards/s.bin", size)
    dst.fs.url(dst.full("shards/s.bin"))  # the S3 client and its service model (megabytes of JSON) exist before
    tracemalloc.start()
    try:
        transfer.copy_shard(src, dst, "shards/s.bin", size, d, chunk_size=chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * chunk, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB shard"
    assert digest_bytes(dst.read_bytes("shards/s.bin")) == d
    assert "-" not in _etag(dst, s3_backend.base.split("://")[1], "ds-stream/shards/s.bin")  # one PUT


@pytest.fixture(params=["low fd", "fd above 1024"])
def high_fd(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Run with the connection's socket on a descriptor past FD_SETSIZE (select() refuses those)."""
    if request.param == "low fd":
        yield False
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        while not fillers or fillers[-1] < 1100:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        yield True
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_connection_the_server_closed_is_replaced_before_reuse(high_fd: bool) -> None:
    """A kept-alive connection the store closed while idle is reopened, not written into (a failed PUT)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        u = urllib.parse.urlsplit(f"http://127.0.0.1:{srv.getsockname()[1]}/b/k?X-Amz-Signature=x")
        conn = http_pool.connection(u)
        conn.connect()
        peer, _ = srv.accept()
        assert conn.sock is not None and (conn.sock.fileno() >= 1024) == high_fd
        assert http_pool.connection(u) is conn and conn.sock is not None  # open and idle: kept
        peer.close()  # the server's idle timeout
        deadline = time.monotonic() + 5
        while conn.sock is not None and time.monotonic() < deadline:
            http_pool.connection(u)
            time.sleep(0.01)
        assert conn.sock is None  # closed here; http.client reconnects on the next request
        http_pool.drop(u, conn)
