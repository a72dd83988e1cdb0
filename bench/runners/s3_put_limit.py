"""Runner: the upload limit to S3 — PUT every file of a directory, nothing else.

Each of ``transfers`` threads reads a whole file and sends it as one presigned PUT (URL made
by s3fs: its endpoint and credentials) on its own kept-alive ``http.client`` connection. No
hashing, no verification, no manifest, no listing, no retries: what any uploader must at least
do, so ``put_s`` (the PUTs alone) shows what the server takes. Used for the S3 link of the
sync suite, where the server (moto, a Python process) shares the machine's two cores.
"""

from __future__ import annotations

import http.client
import os
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import s3fs
from _common import args, emit, now


def main() -> None:
    a = args()
    src, dst, transfers = a["src"], a["dst"].removeprefix("s3://").rstrip("/"), int(a["transfers"])
    files = [os.path.join(base, n) for base, _d, names in os.walk(src) for n in names]
    fs = s3fs.S3FileSystem(config_kwargs={"s3": {"payload_signing_enabled": False}})
    local = threading.local()

    def put(path: str) -> int:
        key = f"{dst}/{os.path.relpath(path, src)}"
        u = urllib.parse.urlsplit(fs.url(key, expires=900, client_method="put_object"))
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=300)
        with open(path, "rb") as f:
            body = f.read()
        conn.request("PUT", f"{u.path}?{u.query}", body=body, headers={"Content-Length": str(len(body))})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"PUT {key}: HTTP {resp.status}")
        return len(body)

    t0 = now()
    with ThreadPoolExecutor(transfers) as pool:
        nbytes = sum(pool.map(put, files))
    emit({"put_s": now() - t0, "bytes": nbytes, "files": len(files)})


if __name__ == "__main__":
    main()
