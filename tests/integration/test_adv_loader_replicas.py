"""Hostile and broken replicas, served over real HTTP on 127.0.0.1 by a server of the test's own that
misbehaves on purpose: it hangs, trickles, answers wrong or short bodies, redirects in a loop, or has
no shards. The loader must take the next replica, or fail in bounded time with a ferry error that
names the shard and the replicas, and never print the credentials a replica URL carries."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scripts.loader_common import pack_test_dataset, token_stream

from ferry.client import TokenDataset, TokenLoader
from ferry.client.fetching.replicas import shown
from ferry.shard_tools.errors import DatasetError, FerryError, ShardError, UsageError

FAST = {"part_size": 4096, "connections": 4, "deadline_floor": 0.3, "deadline_slack": 1.0}
SEQ = 32
SECRET = "s3cr3t-pw-77"
TOKEN = "sig=t0ken-99"
HOLD = 30.0  # the longest a misbehaving answer is held back (the server's stop ends it sooner)


class Replica(ThreadingHTTPServer):
    """A directory served over HTTP with ranged GETs; ``mode`` says how shard requests misbehave:
    ok, hang, trickle (a byte a second), wrong (bytes flipped), short (half the body, its length
    declared), redirect (to itself, forever), missing (404), norange (the whole file for a ranged GET, as
    a static file server without Range support answers)."""

    daemon_threads = True

    def __init__(self, root: Path, mode: str = "ok") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.mode, self.stop = root, mode, threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, name="test-replica", daemon=True)
        self.thread.start()

    def url(self, path: str, auth: bool = False) -> str:
        cred = f"alice:{SECRET}@" if auth else ""
        return f"http://{cred}127.0.0.1:{self.server_address[1]}/{path}"

    def close(self) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    server: Replica

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        srv = self.server
        path = self.path.split("?")[0]
        mode = srv.mode if "/shards/" in path else "ok"
        if mode == "hang":
            srv.stop.wait(HOLD)
            return
        if mode == "redirect":
            self._head(302, 0, Location=self.path)
            return
        file = srv.root / path.lstrip("/")
        if mode == "missing" or not file.is_file() or srv.root not in file.resolve().parents:
            self._head(404, 0)
            return
        data = file.read_bytes()
        span = None if mode == "norange" else re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if span:
            data = data[int(span[1]) : int(span[2]) + 1 if span[2] else None]
        if mode == "wrong":
            data = bytes(b ^ 0x55 for b in data)
        if mode == "short":
            data = data[: len(data) // 2]
        self._head(206 if span else 200, len(data) if mode != "trickle" else len(data) + 1)
        if head:
            return
        if mode == "trickle":
            for k in range(int(HOLD)):
                if srv.stop.wait(1.0) or k >= len(data):
                    return
                self.wfile.write(data[k : k + 1])
                self.wfile.flush()
        self.wfile.write(data)

    def _head(self, code: int, length: int, **headers: str) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("http")
    pack_test_dataset(str(base / "ds"), 400, shard_size=8 << 10)
    return base


def _serve(root: Path, mode: str) -> Iterator[Replica]:
    srv = Replica(root, mode)
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def good(root: Path) -> Iterator[Replica]:
    yield from _serve(root, "ok")


@pytest.fixture(params=["hang", "trickle", "wrong", "short", "redirect", "missing", "norange"])
def bad(root: Path, request: pytest.FixtureRequest) -> Iterator[Replica]:
    yield from _serve(root, request.param)


def _epoch(urls: Any, cache: Path, num_workers: int = 0) -> tuple[TokenLoader, np.ndarray]:
    ds = TokenDataset(urls, seq_len=SEQ, shuffle="none", cache_dir=str(cache), fetch=FAST)
    loader = TokenLoader(ds, batch_size=8, num_workers=num_workers)
    return loader, np.concatenate([b["input_ids"].numpy() for b in loader])


def test_a_bad_first_replica_gives_way_to_the_next_and_the_data_is_right(
    root: Path, bad: Replica, good: Replica, tmp_path: Path
) -> None:
    _, rows = _epoch([bad.url("ds"), good.url("ds")], tmp_path)
    stream = token_stream(str(root / "ds"))
    want = stream[: len(rows) * SEQ].reshape(-1, SEQ)
    assert np.array_equal(rows, want)


def test_every_replica_bad_is_a_ferry_error_naming_the_shard_and_each_replica_in_bounded_time(
    bad: Replica, root: Path, tmp_path: Path
) -> None:
    other = Replica(root, bad.mode)
    try:
        t0 = time.monotonic()
        with pytest.raises(FerryError) as err:
            _epoch([bad.url("ds"), other.url("ds")], tmp_path)
        took = time.monotonic() - t0
    finally:
        other.close()
    assert took < HOLD  # bounded by the deadlines, not by how long a replica holds its answer
    assert isinstance(err.value, (ShardError, DatasetError))
    text = str(err.value)
    assert "shards/" in text
    assert bad.url("ds") in text and other.url("ds") in text


def test_credentials_in_replica_urls_are_never_printed(bad: Replica, good: Replica, tmp_path: Path) -> None:
    """Not in errors, reprs, stats, Prometheus text or the loader state (a mixture's plan names its sources)."""
    shown = []
    for urls in (bad.url("ds", auth=True), good.url(f"ds?{TOKEN}", auth=True)):  # a bad replica; no dataset there
        with pytest.raises(FerryError) as err:
            _epoch(urls, tmp_path / "one")
        shown += [str(err.value), repr(err.value)]
    loader, _ = _epoch([bad.url("ds", auth=True), good.url("ds", auth=True)], tmp_path / "two")
    ds = loader.dataset
    mixed = TokenLoader(TokenDataset.mix([ds, ds], [1, 1]), batch_size=2)
    next(iter(mixed))
    shown += [repr(ds), str(ds.url), json.dumps(loader.stats()), loader.prometheus(), json.dumps(mixed.state_dict())]
    with pytest.raises(UsageError) as usage:
        TokenDataset([bad.url(f"ds?{TOKEN}", auth=True), 3], seq_len=SEQ)  # type: ignore[list-item]
    shown.append(str(usage.value))
    for text in shown:
        assert SECRET not in text and "alice" not in text and TOKEN not in text, text
    assert bad.url("ds") in shown[0]  # the replica is still named, without its credentials


def test_a_replica_that_ignores_range_requests_is_named_as_such(root: Path, tmp_path: Path) -> None:
    """A static file server without Range support answers every part of a shard with the whole file:
    the error says so, instead of calling the shard corrupt."""
    stored = max(f.stat().st_size for f in (root / "ds" / "shards").iterdir())
    assert stored > FAST["part_size"]  # shards of several parts
    for workers in (0, 1):
        srv = Replica(root, "norange")
        try:
            with pytest.raises(ShardError, match="ignores Range requests") as err:
                _epoch(srv.url("ds"), tmp_path / str(workers), num_workers=workers)
        finally:
            srv.close()
        assert "corrupt" not in str(err.value) and "longer than" not in str(err.value)


def test_a_replica_redirecting_in_a_loop_is_named_as_such(root: Path, tmp_path: Path) -> None:
    """The storage library's error says only '0, message=...' for it: its class names the cause."""
    srv = Replica(root, "redirect")
    try:
        with pytest.raises(ShardError) as err:
            _epoch(srv.url("ds"), tmp_path)
    finally:
        srv.close()
    assert "redirect" in str(err.value).lower()


@pytest.mark.parametrize(
    "options",
    [
        json.dumps({"key": "AKIAEXAMPLE", "secret": SECRET}),  # the JSON text instead of the mapping
        [{"key": "AKIAEXAMPLE"}, f"secret={SECRET}"],
        ("secret", SECRET),
    ],
)
def test_malformed_storage_options_are_refused_without_printing_them(
    good: Replica, tmp_path: Path, options: Any
) -> None:
    with pytest.raises(UsageError, match="storage_options must be a mapping") as err:
        TokenDataset([good.url("ds"), good.url("ds")], seq_len=SEQ, storage_options=options, cache_dir=str(tmp_path))
    assert SECRET not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)


@pytest.mark.parametrize(
    "option",
    [
        {"deadline_floor": float("inf")},
        {"deadline_slack": float("inf")},
        {"prior_latency": float("inf")},
        {"prior_rate": float("inf")},
        {"deadline_floor": 1e300},
        {"prior_rate": 1e-300},
    ],
)
def test_fetch_options_without_a_finite_deadline_are_usage_errors(good: Replica, tmp_path: Path, option: Any) -> None:
    """Without a finite deadline every read would raise OverflowError (or wait for ever on a hung replica)."""
    with pytest.raises(UsageError, match=f"fetch.{next(iter(option))}"):
        TokenDataset(good.url("ds"), seq_len=SEQ, cache_dir=str(tmp_path), fetch=option)


def test_the_largest_fetch_options_still_read(good: Replica, root: Path, tmp_path: Path) -> None:
    """Deadlines past what a thread can wait for are waited for as long as it can, not an OverflowError."""
    limits = {"deadline_floor": 1e6, "deadline_slack": 1e6, "prior_latency": 1e6, "prior_rate": 1.0}
    ds = TokenDataset(good.url("ds"), seq_len=SEQ, shuffle="none", cache_dir=str(tmp_path), fetch=limits)
    rows = np.concatenate([b["input_ids"].numpy() for b in TokenLoader(ds, batch_size=8)])
    want = token_stream(str(root / "ds"))[: len(rows) * SEQ].reshape(-1, SEQ)
    assert np.array_equal(rows, want)


@pytest.mark.parametrize(
    ("url", "printed"),
    [
        (f"https://alice:{SECRET}@host:8443/ds?{TOKEN}#frag", "https://host:8443/ds"),
        ("https://ghp_tokenonly@host/ds", "https://host/ds"),
        (f"s3://AKIAEXAMPLE:{SECRET}@bucket/ds", "s3://bucket/ds"),
        (f"az://container/ds?sv=2024&{TOKEN}", "az://container/ds"),  # an Azure SAS token
        ("abfs://container@account.dfs.core.windows.net/ds", "abfs://container@account.dfs.core.windows.net/ds"),
        (f"abfs://key:{SECRET}@account/ds", "abfs://account/ds"),
        (f"http://alice:{SECRET}@[::1/ds?{TOKEN}", "http://[::1/ds"),  # not even a valid URL
        ("s3://bucket/ds", "s3://bucket/ds"),
        ("/data/ds@2024?", "/data/ds@2024?"),  # a path is a path
    ],
)
def test_a_url_is_printed_without_its_credentials(url: str, printed: str) -> None:
    assert shown(url) == printed


def test_a_state_that_names_a_url_with_credentials_does_not_pass_them_on(good: Replica, tmp_path: Path) -> None:
    """A mixture's plan written before URLs were printed without credentials: loading it, describing it
    and saving the next state show the URL without them."""
    from ferry.client.resume.state_cli import describe

    ds = TokenDataset(good.url("ds", auth=True), seq_len=SEQ, cache_dir=str(tmp_path))
    loader = TokenLoader(TokenDataset.mix([ds, ds], [(0, [1, 1]), (8, [1, 2])]), batch_size=2)
    batches = iter(loader)
    next(batches)
    old = loader.state_dict()
    for source in old["plan"]["sources"]:
        source[1] = good.url("ds", auth=True)  # as an older ferry wrote it
    resumed = TokenLoader(TokenDataset.mix([ds, ds], [(0, [1, 1]), (8, [1, 2])]), batch_size=2)
    resumed.load_state_dict(old)
    next(iter(resumed))
    for text in (json.dumps(resumed.state_dict()), "\n".join(describe(old))):
        assert SECRET not in text and good.url("ds") in text
