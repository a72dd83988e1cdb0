"""Shared fixtures: storage backends (file, memory, S3 on moto over HTTP), ports, torchrun, `ferry verify`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from shard_tools.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, timeout: float = 30.0, proc: subprocess.Popen[Any] | None = None) -> None:
    """Until something listens on 127.0.0.1:``port``; TimeoutError after ``timeout`` seconds (callers
    retry on it), AssertionError as soon as ``proc`` exits."""
    from helpers import wait_until  # here: helpers imports the service, which conftest itself never needs

    try:
        wait_until(lambda: listening(port), timeout, f"a server listening on 127.0.0.1:{port}", proc=proc)
    except AssertionError as e:
        if proc is not None and proc.poll() is not None:
            raise
        raise TimeoutError(str(e)) from None


def run_group(cmd: list[str], timeout: float = 180) -> None:
    """Run ``cmd`` in its own process group (one thread per process: ranks share two cores). On a
    timeout every process in it dumps its Python stacks (the training scripts register faulthandler
    on SIGUSR1) and the whole group is killed, so a hang leaves a diagnosis and no orphaned ranks
    or DataLoader workers behind."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)}\ntimed out after {timeout:.0f} s; stacks:\n{stderr[-12000:]}")
    assert proc.returncode == 0, f"{' '.join(cmd)}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-8000:]}"


def torchrun(script: Any, nproc: int, args: list[str], timeout: float = 180) -> None:
    """``torchrun --nproc_per_node NPROC SCRIPT ARGS`` on 127.0.0.1, through :func:`run_group`."""
    run_group(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args],
        timeout,
    )  # fmt: skip


def run_verify(
    url: str, capsys: pytest.CaptureFixture[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[int, str, dict[str, Any]]:
    """``ferry verify URL [-S KEY=VALUE ...]`` in-process: its exit code, its stderr, and its ``--json`` report."""
    args = ["verify", url, *(f"-S{k}={json.dumps(v)}" for k, v in (storage_options or {}).items())]
    code = main(args)
    text = capsys.readouterr()
    main([*args, "--json"])
    report = json.loads(capsys.readouterr().out)
    return code, text.err, report


def arrow_file(column: pa.Array) -> bytes:
    """An Arrow IPC file holding ``column`` as the tokens of a ferry shard (before compression)."""
    schema = pa.schema([("tokens", column.type)], metadata={b"ferry.format": b"1"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as w:
        w.write_batch(pa.record_batch([column], schema=schema))
    return sink.getvalue().to_pybytes()


@dataclass(frozen=True)
class Backend:
    """A place to put datasets: ``url(name)`` gives a fresh dataset URL there."""

    name: str
    base: str
    storage_options: dict[str, Any]

    def url(self, name: str) -> str:
        return f"{self.base.rstrip('/')}/{name}"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (as s3fs's own test-suite does), for the whole session."""
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env.pop("AWS_CA_BUNDLE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        wait_for_port(port, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="session")
def s3_env(moto_endpoint: str) -> dict[str, str]:
    """Environment variables that point any process (s3fs, boto) at the moto server."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": moto_endpoint,
    }


@pytest.fixture
def s3_backend(moto_endpoint: str, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A fresh bucket on the moto server."""
    import s3fs

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": moto_endpoint}}
    bucket = f"ferry-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.mkdir(bucket)
    s3fs.S3FileSystem.clear_instance_cache()
    return Backend("s3", f"s3://{bucket}", options)


@pytest.fixture
def file_backend(tmp_path: Any) -> Backend:
    return Backend("file", str(tmp_path / "store"), {})


@pytest.fixture
def memory_backend() -> Iterator[Backend]:
    import fsspec

    base = f"memory://ferry-test-{uuid.uuid4().hex[:8]}"
    yield Backend("memory", base, {})
    fs = fsspec.filesystem("memory")
    if fs.exists(base):
        fs.rm(base, recursive=True)


@pytest.fixture(params=["file", "memory", "s3"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """The same test on every backend (STYLE.md: one suite, several backends)."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]
