"""Shared set-up for the API, client, status and dashboard tests: a real daemon + uvicorn on 127.0.0.1.

(Imported by name: ``tests/`` is on ``sys.path`` because of ``tests/conftest.py``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from client.service_client import ServiceClient
from service.api import RunningServer, start_server
from service.config import Config, parse_config
from service.daemon import Daemon
from shard_tools.packing import PackOptions, PackResult, pack_documents

TOKEN = "test-token-0123456789"
TOKEN_ENV = "FERRY_TEST_API_TOKEN"


def make_docs(n_docs: int, seed: int = 0, vocab: int = 1000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab - 1, size=int(rng.integers(50, 400)), dtype=np.uint16) for _ in range(n_docs)]


def pack(url: str, n_docs: int = 200, seed: int = 0, shard_size: int = 8192, append: bool = False) -> PackResult:
    """A small dataset (a few dozen shards) at ``url``."""
    opts = PackOptions(vocab_size=1000, eos_id=999, shard_size=shard_size, progress=False, append=append)
    return pack_documents(make_docs(n_docs, seed), url, opts)


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Service:
    root: Path
    config: Config
    daemon: Daemon
    server: RunningServer
    client: ServiceClient  # with the token

    @property
    def url(self) -> str:
        return self.server.url

    def east(self, name: str) -> str:
        return str(self.root / "east" / name)

    def west(self, name: str) -> str:
        return str(self.root / "west" / name)

    def west_version(self, name: str) -> str | None:
        cell = self.client.replicas().cell(name, "west")
        return cell.published_version if cell else None


def write_serve_config(root: Path, port: int) -> Path:
    """A ferry.toml for a `ferry serve` subprocess: clusters src → d1 under ``root``, fast polls, one attempt."""
    (root / "d1").mkdir(parents=True, exist_ok=True)
    p = root / "ferry.toml"
    p.write_text(f"""
state_dir = "{root}/state"
poll_interval = 0.2

[clusters.src]
url = "{root}/src"
[clusters.d1]
url = "{root}/d1"

[[rules]]
datasets = "*"
from = "src"
to = ["d1"]

[limits]
retries = 1

[api]
port = {port}
""")
    return p


def make_config(root: Path, *, read_protected: bool = False, bwlimit: str | None = None, **extra: Any) -> Config:
    (root / "east").mkdir(parents=True, exist_ok=True)
    (root / "west").mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "clusters": {"east": {"url": str(root / "east"), "priority": 10}, "west": {"url": str(root / "west")}},
        "rules": [{"datasets": "*", "from": "east", "to": ["west"]}],
        "limits": {"transfers": 2, "retries": 1, **({"bwlimit": bwlimit} if bwlimit else {})},
        "state_dir": str(root / "state"),
        "poll_interval": 0.3,
        "api": {"token_env": TOKEN_ENV, "read_protected": read_protected, "sla_minutes": 1},
        **extra,
    }
    return parse_config(doc, base_dir=root)


@contextmanager
def running_service(root: Path, monkeypatch: Any, **kw: Any) -> Iterator[Service]:
    """Daemon + API server on a free port; the token is in the environment as ``[api] token_env`` says."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    config = make_config(root, **kw)
    daemon = Daemon(config)
    daemon.start()
    server = start_server(daemon, config, port=0)
    client = ServiceClient(server.url, token=TOKEN)
    try:
        yield Service(root, config, daemon, server, client)
    finally:
        client.close()
        server.stop()
        daemon.stop(timeout=10)
