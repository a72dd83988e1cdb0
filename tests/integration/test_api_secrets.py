"""Credentials from the config (storage options, the API token) never appear in a response, page or log line.

A real ``ferry serve`` process replicates between two buckets of a moto S3 server with credentials
taken from the environment; we read every endpoint and the process's whole output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import s3fs
from configs import Api, Cluster, FerryToml, Rule
from helpers import make_docs, wait_until

from ferry.shard_tools.packer.packing import PackOptions, pack_documents

KEY = "AKIAFERRYKEY7Q3X9Z"
SECRET = "ferry-s3cr3t-value-never-shown-42"
TOKEN = "ferry-api-token-never-shown-99"


def test_no_secret_in_any_response_page_or_log(tmp_path: Path, moto_endpoint: str) -> None:
    from conftest import free_port

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": moto_endpoint})
    for bucket in ("sec-east", "sec-west"):
        fs.mkdir(bucket)
    opts = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": moto_endpoint}}
    res = pack_documents(
        make_docs(80),
        "s3://sec-east/corpus",
        PackOptions(vocab_size=1000, eos_id=999, shard_size=8192, progress=False, storage_options=opts),
    )
    port = free_port()
    options = {"key": "$FT_KEY", "secret": "$FT_SECRET", "client_kwargs": {"endpoint_url": moto_endpoint}}
    config = FerryToml(
        clusters={
            "east": Cluster("s3://sec-east", storage_options=options),
            "west": Cluster("s3://sec-west", storage_options=options),
        },
        rules=[Rule("east", ["west"])],
        api=Api(port=port, token_env="FT_TOKEN"),
        state_dir="state",
        poll_interval=0.3,
    ).write(tmp_path / "ferry.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    env.update(FT_KEY=KEY, FT_SECRET=SECRET, FT_TOKEN=TOKEN)
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(config), "--access-log",
             "--log-level", "debug"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    bodies: list[str] = []
    try:
        base = f"http://127.0.0.1:{port}"
        http = httpx.Client(base_url=base, timeout=10)

        def published() -> bool:
            try:
                cells = http.get("/api/v1/replicas").json()["cells"]
            except httpx.HTTPError:
                return False
            return any(c["cluster"] == "west" and c["published_version"] == res.version_id for c in cells)

        wait_until(published, timeout=60, what="replication between the moto buckets")
        paths = [
            "/", "/static/app.js", "/static/app.css", "/api/v1/openapi.json", "/api/v1/status",
            "/api/v1/clusters", "/api/v1/datasets", "/api/v1/datasets/corpus", "/api/v1/replicas",
            "/api/v1/transfers", "/api/v1/history?limit=1000", "/api/v1/errors", "/api/v1/links",
            "/api/v1/throughput", "/api/v1/limits", "/metrics", "/healthz", "/readyz", "/api/v1/datasets/nope",
        ]  # fmt: skip
        for path in paths:
            r = http.get(path)
            assert r.status_code in (200, 404), (path, r.status_code)
            bodies.append(f"{path} {r.headers} {r.text}")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for method, path in (("POST", "/api/v1/pause"), ("POST", "/api/v1/resume"), ("POST", "/api/v1/sync")):
            bodies.append(http.request(method, path, headers={"Authorization": "Bearer wrong"}).text)
            r = http.request(method, path, headers=auth)
            assert r.status_code == 200
            bodies.append(r.text)
        bodies.append(http.put("/api/v1/limits", json={"global_bps": "x"}, headers=auth).text)
        with http.stream("GET", "/api/v1/events") as stream:  # the first frame (hello, with the status)
            for chunk in stream.iter_text():
                bodies.append(chunk)
                break
        assert any(b.startswith("event: hello") for b in bodies)
        assert any("s3://sec-east" in b for b in bodies)  # the URL is shown, its credentials are not
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    text = "\n".join(bodies)
    logs = log.read_text()
    assert "GET /api/v1/replicas" in logs  # the access log was on
    for secret in (KEY, SECRET, TOKEN):
        assert secret not in text, f"{secret[:6]}… leaked into a response"
        assert secret not in logs, f"{secret[:6]}… leaked into the log"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
