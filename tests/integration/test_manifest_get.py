"""A job whose shards are all in the node cache reads its S3 manifest with one signed GET and never creates an S3
client (botocore parses its service models for one); anything that GET does not handle goes through the
filesystem as before."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import s3fs
from conftest import Backend
from helpers import pack

import ferry.shard_tools.storage.s3_get as s3_get
from ferry.client.stream.dataset import TokenDataset
from ferry.client.stream.loader import TokenLoader
from ferry.shard_tools.errors import DatasetNotFoundError


def rows(ds: TokenDataset) -> np.ndarray:
    loader = TokenLoader(ds, batch_size=8, num_workers=0, service=False)
    return np.concatenate([b["input_ids"].numpy() for b in loader])


def open_s3(url: str, backend: Backend, cache: Path, **options: Any) -> TokenDataset:
    s3fs.S3FileSystem.clear_instance_cache()  # a new process' filesystem: no client made yet
    opts = {**backend.storage_options, **options}
    return TokenDataset(url, seq_len=32, seed=5, cache_dir=str(cache), storage_options=opts)


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every plain GET (its span and whether it answered) and every S3 client made."""
    seen: dict[str, list[Any]] = {"gets": [], "clients": []}
    real_fetch, real_session = s3_get.fetch, s3fs.S3FileSystem.set_session

    def fetch(get: s3_get.S3Get, max_bytes: int, span: tuple[int, int] | None = None) -> bytes | None:
        body = real_fetch(get, max_bytes, span)
        seen["gets"].append((get.path, span, body is not None))
        return body

    async def set_session(self: s3fs.S3FileSystem, *args: Any, **kwargs: Any) -> Any:
        if self._s3 is None:
            seen["clients"].append(self)
        return await real_session(self, *args, **kwargs)

    monkeypatch.setattr(s3_get, "fetch", fetch)
    monkeypatch.setattr(s3fs.S3FileSystem, "set_session", set_session)
    return seen


def test_a_warm_job_reads_its_manifest_without_an_s3_client(
    s3_backend: Backend, tmp_path: Path, spies: dict[str, list[Any]]
) -> None:
    url = s3_backend.url("ds")
    pack(url, 120, s3_backend.storage_options)
    cache = tmp_path / "cache"
    cold = rows(open_s3(url, s3_backend, cache))  # fills the node cache (shards need the S3 client)
    assert spies["clients"], "the cold epoch read shards through s3fs"
    spies["clients"].clear()
    spies["gets"].clear()
    warm = rows(open_s3(url, s3_backend, cache))
    np.testing.assert_array_equal(warm, cold)
    assert spies["clients"] == []  # before the change: the manifest's GET made one
    assert [(span, ok) for _, span, ok in spies["gets"]] == [((0, 1 << 20), True)]
    assert spies["gets"][0][0].endswith("/ds/manifest.json")


def test_what_the_plain_get_does_not_handle_goes_through_the_filesystem(
    s3_backend: Backend, tmp_path: Path, spies: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = s3_backend.url("ds")
    pack(url, 60, s3_backend.storage_options)
    cache = tmp_path / "cache"
    reference = rows(open_s3(url, s3_backend, cache))
    # a setting it leaves to botocore: no plain GET at all
    spies["clients"].clear()
    spies["gets"].clear()
    np.testing.assert_array_equal(rows(open_s3(url, s3_backend, cache, requester_pays=False)), reference)
    assert spies["gets"] == [] and len(spies["clients"]) == 1
    # an answer it cannot use (here: none), then the filesystem reads the same bytes
    spies["clients"].clear()
    monkeypatch.setattr(s3_get, "fetch", lambda *a, **k: None)
    np.testing.assert_array_equal(rows(open_s3(url, s3_backend, cache)), reference)
    assert len(spies["clients"]) == 1
    # a dataset that is not there: the same error as ever
    with pytest.raises(DatasetNotFoundError):
        open_s3(s3_backend.url("nothing-here"), s3_backend, cache)


def test_a_ranged_plain_get_gives_exactly_the_bytes_asked(s3_backend: Backend) -> None:
    fs = s3fs.S3FileSystem(**s3_backend.storage_options, skip_instance_cache=True)
    data = bytes(range(256)) * 40
    url = s3_backend.url("blob")
    fs.pipe_file(url[5:], data)
    get = s3_get.plan_s3_get(url, s3_backend.storage_options, {"HOME": "/nonexistent"})
    assert get is not None
    assert s3_get.fetch(get, 100, (0, 100)) == data[:100]
    assert s3_get.fetch(get, 77, (5000, 5077)) == data[5000:5077]
    assert s3_get.fetch(get, 1 << 20, (10_000, 10_000 + (1 << 20))) == data[10_000:]  # the object ends first
    assert s3_get.fetch(get, len(data)) == data
    assert s3_get.fetch(get, len(data) - 1) is None  # larger than allowed
    assert s3_get.fetch(get, 10, (len(data) + 5, len(data) + 15)) is None  # past the end: 416
    missing = s3_get.plan_s3_get(url + "-not-there", s3_backend.storage_options, {"HOME": "/nonexistent"})
    assert missing is not None and s3_get.fetch(missing, 100, (0, 100)) is None
    with pytest.raises(ValueError):
        s3_get.fetch(get, 10, (10, 10))


class _Liar(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the status and body the test sets on the server."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        status, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_that_answers_a_range_wrongly_gives_nothing(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Liar)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        get = s3_get.S3Get("http", f"127.0.0.1:{server.server_address[1]}", "/b/x", "us-east-1", None)
        server.answer = (206, b"x" * 110)  # type: ignore[attr-defined]
        assert s3_get.fetch(get, 100, (0, 100)) is None  # more than asked
        server.answer = (200, b"y" * 50)  # type: ignore[attr-defined]
        assert s3_get.fetch(get, 100, (0, 100)) == b"y" * 50  # Range ignored, the whole object fits: the same bytes
        assert s3_get.fetch(get, 100, (10, 110)) is None  # Range ignored from an offset: not the bytes asked
        server.answer = (403, b"<Error/>")  # type: ignore[attr-defined]
        assert s3_get.fetch(get, 100, (0, 100)) is None
    finally:
        server.shutdown()
        server.server_close()
