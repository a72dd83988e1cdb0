"""Why ferry keeps two small HTTP pieces of its own beside the libraries it has: measured, side by side.

1. ``service/transfer/http_pool.py`` (kept-alive ``http.client`` connections and a reused upload buffer
   per thread, for presigned PUTs of shards) against an ``httpx.Client`` pool doing the same PUTs:
   wall MiB/s and client CPU per request and per GiB, to a local server process that drains each body.
2. ``shard_tools/storage/s3_get.py`` (its own SigV4 signer, for the no-op check's manifest GET) against
   botocore's ``S3SigV4Auth``: the cost of one signature, and of importing what each one needs in a
   fresh interpreter (the no-op check runs once per ``ferry sync``).

    .venv/bin/python bench/http_clients.py [--requests 200] [--sizes 65536,8388608]

Prints JSON; ``bench/run.py --only scale`` runs it and renders the numbers on the benchmarks page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

__all__ = ["main"]


def _serve(sock: socket.socket) -> None:
    """Drain PUT bodies on kept-alive connections; answer 200 with an empty body."""

    def handle(conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        pending = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in pending:
                    got = conn.recv(65536)
                    if not got:
                        return
                    pending += got
                head, _, pending = pending.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                left = length - len(pending)
                pending = b"" if left >= 0 else pending[length:]
                while left > 0:
                    n = conn.recv_into(buf, min(left, len(buf)))
                    if not n:
                        return
                    left -= n
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def _pool_puts(url: str, body: bytes, n: int) -> None:
    from ferry.service.transfer import http_pool

    u = urllib.parse.urlsplit(url)
    view = memoryview(body)
    chunk = 8 << 20
    for _ in range(n):
        conn = http_pool.connection(u)
        buf = memoryview(http_pool.chunk_buffer(min(chunk, len(body))))
        conn.putrequest("PUT", u.path, skip_accept_encoding=True)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        for off in range(0, len(body), chunk):  # as s3_presigned: each piece through the thread's buffer
            piece = view[off : off + chunk]
            buf[: len(piece)] = piece
            conn.send(buf[: len(piece)])
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        buf.release()


def _httpx_puts(url: str, body: bytes, n: int) -> None:
    import httpx

    with httpx.Client(timeout=300) as client:
        for _ in range(n):
            assert client.put(url, content=body).status_code == 200


def _timed(fn: Any, url: str, body: bytes, n: int) -> dict[str, float]:
    fn(url, body, 3)  # warm: connection made, modules imported
    c0, t0 = time.process_time(), time.perf_counter()
    fn(url, body, n)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    gib = len(body) * n / 2**30
    return {"mib_s": len(body) * n / 2**20 / wall, "cpu_us_per_request": cpu / n * 1e6, "cpu_s_per_gib": cpu / gib}


def _puts(requests: int, sizes: list[int], rounds: int) -> dict[str, Any]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = multiprocessing.get_context("fork").Process(target=_serve, args=(sock,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/bucket/shard"
    out: dict[str, Any] = {}
    try:
        for size in sizes:
            body = os.urandom(size)
            n = max(3, requests if size <= 1 << 20 else requests // 10)
            runs: dict[str, list[dict[str, float]]] = {"http_pool": [], "httpx": []}
            for _ in range(rounds):  # alternate, so a load change on the machine hits both
                runs["http_pool"].append(_timed(_pool_puts, url, body, n))
                runs["httpx"].append(_timed(_httpx_puts, url, body, n))
            out[str(size)] = {
                "requests": n,
                **{k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()},
            }
    finally:
        server.kill()
        server.join(5)
        sock.close()
    return out


def _import_ms(statement: str, rounds: int) -> float:
    """Median wall ms of ``statement`` in a fresh interpreter, less that of an empty one."""

    def once(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - t0

    base = statistics.median(once("pass") for _ in range(rounds))
    return (statistics.median(once(statement) for _ in range(rounds)) - base) * 1e3


def _signing(n: int, rounds: int) -> dict[str, Any]:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from ferry.shard_tools.storage.s3_get import S3Get, sign_v4

    get = S3Get(
        "https", "bucket.s3.us-east-1.amazonaws.com", "/ds/manifest.json", "us-east-1", ("AKID", "SECRET", None)
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    creds = Credentials("AKID", "SECRET")

    def ours() -> None:
        sign_v4(get, now)

    def botocore() -> None:
        req = AWSRequest(method="GET", url="https://bucket.s3.us-east-1.amazonaws.com/ds/manifest.json")
        S3SigV4Auth(creds, "s3", "us-east-1").add_auth(req)

    def per_call(fn: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    return {
        "sign_us": {
            "s3_get": statistics.median(per_call(ours) for _ in range(rounds)),
            "botocore": statistics.median(per_call(botocore) for _ in range(rounds)),
        },  # fmt: skip
        "import_ms": {
            "s3_get": _import_ms("import ferry.shard_tools.storage.s3_get", rounds),
            "botocore_signer": _import_ms(
                "import botocore.auth, botocore.awsrequest, botocore.credentials", rounds
            ),  # fmt: skip
            "botocore_session_client": _import_ms(
                "import botocore.session; botocore.session.get_session().create_client('s3', region_name='us-east-1',"
                " aws_access_key_id='a', aws_secret_access_key='b')",
                rounds,
            ),  # fmt: skip
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="PUTs per measurement for bodies up to 1 MiB")
    p.add_argument("--sizes", default="65536,8388608,33554432", help="PUT body sizes in bytes")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    result = {
        "puts": _puts(a.requests, [int(s) for s in a.sizes.split(",")], a.rounds),
        "signing": _signing(2000, a.rounds),
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
