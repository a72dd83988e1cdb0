"""Ranged S3 reads past fsspec (``ferry.shard_tools.storage.s3_ranged``, ``ferry.client.fetching.direct``).

Against a raw HTTP server of this file's own (each answer exactly as written, hostile ones included): a good
``206`` is taken, anything it cannot vouch for is None (so the loader reads it through fsspec), a kept-alive
connection the server closed is replaced, an abort frees a read that hangs, and a forked child opens its own
connections. Against moto behind the delay proxy: a loader's epoch takes every shard byte this way, and equals
the stream read from local disk.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import upload_to_moto
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.fetching.direct import root_of, start_direct
from ferry.client.fetching.pools import DaemonPool
from ferry.shard_tools.storage import s3_ranged
from ferry.shard_tools.storage.s3_ranged import RangedGet, S3Root, plan_root
from ferry.shard_tools.storage.store import Location

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from netem import Netem  # noqa: E402

BODY = bytes(range(256)) * 64  # the object every request reads (16 KiB)


class RawServer:
    """HTTP/1.1 on 127.0.0.1 that answers ranged GETs of ``BODY`` the way ``mode`` says; counts connections."""

    def __init__(self, mode: str = "good") -> None:
        self.mode = mode
        self.connections = 0
        self.requests = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:  # the client may close first (it refused an answer)
            f = conn.makefile("rb")
            for _ in range(100):  # requests on one connection, bounded
                line = f.readline()
                if not line:
                    return
                headers = {}
                for _ in range(100):
                    h = f.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                self.requests += 1
                if not self._answer(conn, headers.get("range", "")):
                    return

    def _answer(self, conn: socket.socket, rng: str) -> bool:
        """Write one answer; False: the connection ends here."""
        a, b = (int(x) for x in rng.removeprefix("bytes=").split("-"))
        b = min(b, len(BODY) - 1)
        part = BODY[a : b + 1]
        mode = self.mode
        if mode == "hang":
            self._stop.wait(30)
            return False
        head = {
            "good": f"206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len(BODY)}\r\nContent-Length: {len(part)}",
            "close": f"206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len(BODY)}\r\nContent-Length: {len(part)}",
            "whole": f"200 OK\r\nContent-Length: {len(BODY)}",
            "shifted": f"206 Partial Content\r\nContent-Range: bytes {a + 1}-{b + 1}/{len(BODY)}\r\n"
            f"Content-Length: {len(part)}",
            "longer": f"206 Partial Content\r\nContent-Range: bytes {a}-{b + 100}/{len(BODY)}\r\n"
            f"Content-Length: {len(part) + 100}",
            "cut": f"206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len(BODY)}\r\nContent-Length: {len(part)}",
            "chunked": f"206 Partial Content\r\nContent-Range: bytes {a}-{b}/{len(BODY)}\r\nTransfer-Encoding: chunked",
            "missing": "404 Not Found\r\nContent-Length: 0",
            "moved": "301 Moved Permanently\r\nContent-Length: 0",
        }[mode]
        body = BODY if mode == "whole" else part + bytes(100) if mode == "longer" else part
        if mode in ("missing", "moved"):
            body = b""
        if mode == "cut":
            body = body[: len(body) // 2]
        if mode == "chunked":
            body = f"{len(part):x}\r\n".encode() + part + b"\r\n0\r\n\r\n"
        conn.sendall(f"HTTP/1.1 {head}\r\n\r\n".encode() + body)
        return mode not in ("close", "cut")  # "close": ends the connection without saying so


@pytest.fixture
def server() -> Iterator[RawServer]:
    s = RawServer()
    yield s
    s.close()


def _root(port: int, tmp_path: Path, prefix: str = "bucket/ds") -> S3Root:
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    root = plan_root(f"s3://{prefix}", options, {"HOME": str(tmp_path)})
    assert root is not None
    return root


def _in_thread(fn: Any) -> Any:
    """``fn()`` in a new thread (as the pool runs reads: one kept-alive connection per thread)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert out, "the read did not end"
    return out[0]


def test_a_root_plans_object_paths_quoted_and_refuses_what_it_does_not_handle(tmp_path: Path) -> None:
    root = _root(1234, tmp_path, "bucket/pre fix")
    get = root.get("shards/a b~c.zst")
    assert (get.host, get.path) == ("127.0.0.1:1234", "/bucket/pre%20fix/shards/a%20b~c.zst")
    options = {"key": "k", "secret": "s", "profile": "other"}
    assert plan_root("s3://bucket/ds", options, {"HOME": str(tmp_path)}) is None
    assert plan_root("gs://bucket/ds", {}, {"HOME": str(tmp_path)}) is None
    proxy_env = {"HOME": str(tmp_path), "HTTPS_PROXY": "http://proxy:3128", "AWS_ACCESS_KEY_ID": "k"}
    assert plan_root("s3://bucket/ds", {"key": "k", "secret": "s"}, proxy_env) is None


def test_reads_share_one_kept_alive_connection_per_thread(server: RawServer, tmp_path: Path) -> None:
    get = _root(server.port, tmp_path).get("o")

    def three() -> list[bytes | None]:
        return [RangedGet(get, a, a + 1000).run() for a in (0, 5000, 16000)]

    assert _in_thread(three) == [BODY[0:1000], BODY[5000:6000], BODY[16000:]]
    assert (server.connections, server.requests) == (1, 3)


def test_a_connection_the_server_closed_is_replaced_and_the_read_sent_again(server: RawServer, tmp_path: Path) -> None:
    server.mode = "close"  # each answer ends its connection without a Connection: close header
    get = _root(server.port, tmp_path).get("o")

    def reads() -> list[bytes | None]:
        out = [RangedGet(get, 0, 100).run()]
        time.sleep(0.1)  # the server's close has arrived: the kept connection is stale
        return [*out, RangedGet(get, 100, 200).run(), RangedGet(get, 200, 300).run()]

    assert _in_thread(reads) == [BODY[0:100], BODY[100:200], BODY[200:300]]
    assert server.connections >= 3


@pytest.mark.parametrize("mode", ["whole", "shifted", "longer", "cut", "chunked", "missing"])
def test_an_answer_it_cannot_vouch_for_is_none(server: RawServer, tmp_path: Path, mode: str) -> None:
    """A Range ignored, a range that starts elsewhere or runs longer, a cut body, a body of unsaid length, an
    error status."""
    server.mode = mode
    get = _root(server.port, tmp_path).get("o")
    assert _in_thread(lambda: RangedGet(get, 10, 1010).run()) is None
    server.mode = "good"  # and the thread's next read works (a new connection where the last one was spoilt)
    assert _in_thread(lambda: RangedGet(get, 10, 1010).run()) == BODY[10:1010]


def test_an_abort_frees_a_read_that_hangs(server: RawServer, tmp_path: Path) -> None:
    server.mode = "hang"
    read = RangedGet(_root(server.port, tmp_path).get("o"), 0, 100)
    out: list[bytes | None] = []
    t = threading.Thread(target=lambda: out.append(read.run()))
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    t0 = time.monotonic()
    read.abort()
    t.join(10)
    assert not t.is_alive() and out == [None]
    assert time.monotonic() - t0 < 2 < s3_ranged.READ_TIMEOUT_S


def _location(server: RawServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Location:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "FSSPEC_S3"):
        monkeypatch.delenv(name, raising=False)
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"}}
    return Location(SimpleNamespace(storage_options=options), "bucket/ds", "s3://bucket/ds")  # type: ignore[arg-type]


def _fallback(fell: list[Future[bytes]]) -> Any:
    def start() -> Future[bytes]:
        fut: Future[bytes] = Future()
        fut.set_result(b"from fsspec")
        fell.append(fut)
        return fut

    return start


def test_a_cancelled_direct_read_stops_and_a_refused_one_reads_through_the_fallback(
    server: RawServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc, pool = _location(server, tmp_path, monkeypatch), DaemonPool(1, "t-direct")  # one thread: see below
    fell: list[Future[bytes]] = []
    fallback = _fallback(fell)

    def direct(a: int, b: int) -> Future[bytes]:
        fut = start_direct(loc, "o", a, b, pool, fallback)
        assert fut is not None
        return fut

    assert direct(0, 10).result(10) == BODY[:10] and not fell
    server.mode = "missing"
    assert direct(0, 10).result(10) == b"from fsspec" and len(fell) == 1
    server.mode = "hang"
    fut = direct(0, 10)
    time.sleep(0.3)
    asked = server.requests
    assert fut.cancel()
    # the hung read was aborted: the pool's only thread takes the next job at once, and no fallback was asked
    server.mode = "good"
    assert direct(20, 30).result(5) == BODY[20:30]
    assert len(fell) == 1 and asked >= 3
    assert root_of(loc) is not None  # a missing object says nothing about the way
    pool.shutdown(wait=False)


def test_an_answer_that_says_the_way_is_wrong_sends_the_location_through_fsspec(
    server: RawServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another region's endpoint (301), say: every read would be asked twice; only the first one is."""
    loc, pool = _location(server, tmp_path, monkeypatch), DaemonPool(1, "t-direct")
    fell: list[Future[bytes]] = []
    server.mode = "moved"
    fut = start_direct(loc, "o", 0, 10, pool, _fallback(fell))
    assert fut is not None and fut.result(10) == b"from fsspec"
    assert root_of(loc) is None and start_direct(loc, "o", 0, 10, pool, _fallback(fell)) is None
    assert server.requests == 1
    pool.shutdown(wait=False)


def test_a_forked_child_opens_its_own_connection(server: RawServer, tmp_path: Path) -> None:
    get = _root(server.port, tmp_path).get("o")
    assert RangedGet(get, 0, 10).run() == BODY[:10]  # a connection kept by this (main) thread
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover — the child
        ok = RangedGet(get, 10, 20).run() == BODY[10:20]
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"1"
    assert server.connections == 2  # the parent's socket was not shared with the child
    assert RangedGet(get, 20, 30).run() == BODY[20:30] and server.connections == 2


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> dict[str, str]:
    local = pack_test_dataset(str(tmp_path_factory.mktemp("direct") / "ds"), 1500, shard_size=32 << 10)
    return {"local": local, "s3": upload_to_moto(moto_endpoint, local, "replica-direct")}


def _epoch(url: str, cache: Path, workers: int, storage: dict[str, Any] | None = None) -> np.ndarray:
    ds = TokenDataset(
        url,
        seq_len=32,
        seed=7,
        shuffle="window",
        window=2,
        cache_dir=str(cache),
        storage_options=storage,
        fetch={"part_size": 4096, "connections": 4},
    )
    try:
        rows = [b["input_ids"].numpy() for b in TokenLoader(ds, batch_size=8, num_workers=workers)]
    finally:
        ds.close()
    return np.concatenate(rows)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_reads_every_shard_byte_past_fsspec(
    dataset: dict[str, str], moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    import s3fs

    fsspec_reads: list[str] = []
    real = s3fs.S3FileSystem._cat_file

    async def counted(self: Any, path: str, *a: Any, **kw: Any) -> Any:
        fsspec_reads.append(path)
        return await real(self, path, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", counted)  # forked workers inherit it
    reference = _epoch(dataset["local"], tmp_path / "c0", 0)
    with Netem(moto_endpoint, rtt=0.002, conn_rate=0, total_rate=0, lifetime=120) as net:
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": net.url}}
        rows = _epoch(dataset["s3"], tmp_path / "c1", workers, options)
        shard_gets = [r for r in net.requests if r.method == "GET" and "/shards/" in r.path]
    np.testing.assert_array_equal(rows, reference)
    assert len(shard_gets) > 10 and all(r.status == 206 for r in shard_gets)
    assert not [p for p in fsspec_reads if "/shards/" in p], fsspec_reads
