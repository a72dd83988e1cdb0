"""What the tests share: one way to make and pack documents, one bounded wait, the set-up of a
real daemon + uvicorn on 127.0.0.1 for the API, client, status and dashboard tests, and the reading
of the dev/test locks.

Imported by name (``from helpers import pack``): ``tests/`` is on ``sys.path`` because of
``tests/conftest.py``. Test modules import this module or conftest, never each other.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from configs import Api, Cluster, FerryToml, Limits, Rule, Staging

from ferry.client.service.service_client import ServiceClient
from ferry.service.api import RunningServer, start_server
from ferry.service.config import Config, parse_config
from ferry.service.daemon import Daemon
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.packer.packing import PackOptions, PackResult, pack_documents

TOKEN = "test-token-0123456789"
TOKEN_ENV = "FERRY_TEST_API_TOKEN"


VOCAB = 1000
EOS = VOCAB - 1  # make_docs never draws it, so every document reads back exactly as packed

ROOT = Path(__file__).resolve().parents[1]
DEV_LOCK = ROOT / "requirements-dev.lock"
TITAN_LOCK = ROOT / "requirements-titan.lock"
_LOCKED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)$")


def normal_name(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(text: str, lock: str = "lock") -> dict[str, str]:
    """name → pinned version of a lock `make lock` wrote: every requirement (a backslash at the end of
    a line continues it, as pip reads it) must be ``name==version`` with one or more ``--hash=sha256:…``."""
    pins: dict[str, str] = {}
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LOCKED.match(line)
        if m is None:
            raise ValueError(f"{lock}: not 'name==version --hash=sha256:…': {line!r}")
        pins[normal_name(m.group(1))] = m.group(2)
    return pins


def make_docs(n_docs: int, seed: int = 0, vocab: int = VOCAB) -> list[np.ndarray]:
    """``n_docs`` documents of 50-399 tokens below ``vocab - 1``, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab - 1, size=int(rng.integers(50, 400)), dtype=np.uint16) for _ in range(n_docs)]


def pack(
    url: str,
    docs: int | Sequence[np.ndarray] = 200,
    storage_options: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    shard_size: int = 8192,
    append: bool = False,
) -> PackResult:
    """Pack ``docs`` (documents, or how many :func:`make_docs` makes from ``seed``) at ``url``: with the
    defaults a small dataset of a few dozen shards."""
    documents = make_docs(docs, seed) if isinstance(docs, int) else docs
    opts = PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=shard_size, storage_options=dict(storage_options or {}),
                       progress=False, append=append)  # fmt: skip
    return pack_documents(documents, url, opts)


def documents(url: str, storage_options: Mapping[str, Any] | None = None) -> list[list[int]]:
    """Every document at ``url`` (EOS stripped), each shard verified against the manifest on the way."""
    return [d.tolist() for d in open_dataset(url, storage_options=dict(storage_options or {})).documents()]


def wait_until(
    check: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    proc: subprocess.Popen[Any] | None = None,
    interval: float = 0.05,
) -> Any:
    """Poll ``check`` until it returns something truthy, and return that; fail after ``timeout``
    seconds, or as soon as ``proc`` (the process expected to bring the condition about) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process {proc.pid} exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


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


def write_serve_config(root: Path, port: int, staging: Staging | None = None) -> Path:
    """A ferry.toml for a `ferry serve` subprocess: clusters src → d1 under ``root``, fast polls, one attempt."""
    (root / "d1").mkdir(parents=True, exist_ok=True)
    return FerryToml(
        clusters={"src": Cluster(f"{root}/src"), "d1": Cluster(f"{root}/d1")},
        rules=[Rule("src", ["d1"], datasets="*")],
        limits=Limits(retries=1),
        api=Api(port=port),
        state_dir=f"{root}/state",
        poll_interval=0.2,
        staging=staging,
    ).write(root / "ferry.toml")


def make_config(root: Path, *, read_protected: bool = False, bwlimit: str | None = None, **extra: Any) -> Config:
    (root / "east").mkdir(parents=True, exist_ok=True)
    (root / "west").mkdir(parents=True, exist_ok=True)
    toml = FerryToml(
        clusters={"east": Cluster(root / "east", priority=10), "west": Cluster(root / "west")},
        rules=[Rule("east", ["west"], datasets="*")],
        limits=Limits(transfers=2, retries=1, bwlimit=bwlimit or None),
        state_dir=root / "state",
        poll_interval=0.3,
        api=Api(token_env=TOKEN_ENV, read_protected=read_protected, sla_minutes=1),
    )
    toml = replace(toml, **{key: Api(**value) if key == "api" else value for key, value in extra.items()})
    return parse_config(toml.doc(), base_dir=root)


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


def upload_to_moto(endpoint: str, local: str, bucket: str) -> str:
    """A byte-for-byte replica of the local dataset ``local`` at ``s3://<bucket>/ds`` on the moto server at
    ``endpoint`` (as ``ferry sync`` would make it); its URL."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
    )
    fs.mkdir(bucket)
    for path in Path(local).rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{bucket}/ds/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"s3://{bucket}/ds"
