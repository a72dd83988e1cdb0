"""``ferry pack --executor ray``: units as Ray tasks on a local Ray instance, output identical to local."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parquet_corpus import parquet_corpus, shard_bytes

from ferry.shard_tools import PackOptions, TokenRangeError, open_dataset, pack, verify
from ferry.shard_tools.packer.packing import merge_parts, pack_part

ray = pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'ferry-data[ray]')")

OPTS = PackOptions(vocab_size=50_257, eos_id=50_256, shard_size=16 * 1024, name="ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def corpus(tmp_path: Path, files: int = 4) -> list[str]:
    return parquet_corpus(tmp_path, files=files, docs=150, seed=5)


@pytest.mark.slow
def test_ray_output_identical_to_local(local_ray: None, tmp_path: Path) -> None:
    from dataclasses import replace

    inputs = corpus(tmp_path)
    local = pack(inputs, str(tmp_path / "local"), replace(OPTS, workers=2))
    on_ray = pack(inputs, str(tmp_path / "ray"), replace(OPTS, executor="ray"))
    assert on_ray.version_id == local.version_id and on_ray.shards == local.shards > 4
    assert shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
    assert verify(str(tmp_path / "ray")).ok
    # parts may run on Ray too, and merge to the same version
    for i in range(2):
        pack_part(inputs, str(tmp_path / "parts"), i, 2, replace(OPTS, executor="ray"))
    assert merge_parts(str(tmp_path / "parts"), OPTS).version_id == local.version_id


@pytest.mark.slow
def test_ray_task_error_surfaces_as_ferry_error(local_ray: None, tmp_path: Path) -> None:
    from dataclasses import replace

    inputs = corpus(tmp_path, files=2)
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 60_000]], type=pa.list_(pa.uint16()))}), tmp_path / "z.parquet")
    with pytest.raises(TokenRangeError, match="z.parquet"):
        pack([*inputs, str(tmp_path / "z.parquet")], str(tmp_path / "ray"), replace(OPTS, executor="ray"))
    assert not (tmp_path / "ray" / "manifest.json").exists()
    assert open_dataset  # the dataset stays unpublished; nothing else to read


def _ray_task_pids(name: str) -> list[int]:
    """This process' Ray workers (its descendants: ``ray.init`` started the instance) currently running a task
    called ``name`` (Ray retitles them ``ray::name``); never another test session's."""
    parents: dict[int, int] = {}
    titled = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
                parents[int(proc.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
                if (proc / "cmdline").read_bytes().startswith(f"ray::{name}".encode()):
                    titled.append(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
    return [pid for pid in titled if _descends_from(pid, os.getpid(), parents)]


def _descends_from(pid: int, root: int, parents: dict[int, int]) -> bool:
    for _ in range(64):  # a chain of parents is short; a bound all the same
        pid = parents.get(pid, 0)
        if pid == root:
            return True
        if pid <= 1:
            return False
    return False


@pytest.mark.slow
def test_killed_ray_worker_is_retried(local_ray: None, tmp_path: Path) -> None:
    import signal
    import threading
    import time
    from dataclasses import replace

    rng = np.random.default_rng(9)
    inputs = []
    for f in range(3):  # units big enough to catch one mid-task
        lists = [rng.integers(0, 50_000, size=int(n)).tolist() for n in rng.integers(1, 2000, size=1500)]
        path = tmp_path / f"big-{f}.parquet"
        pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path)
        inputs.append(str(path))
    killed: list[int] = []

    def assassin() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not killed:
            for pid in _ray_task_pids("pack_unit"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.005)

    thread = threading.Thread(target=assassin, daemon=True)
    thread.start()
    on_ray = pack(inputs, str(tmp_path / "ray"), replace(OPTS, executor="ray", shard_size=64 * 1024))
    thread.join(5)
    local = pack(inputs, str(tmp_path / "local"), replace(OPTS, shard_size=64 * 1024))
    assert killed, "no Ray worker was caught running pack_unit"
    assert on_ray.version_id == local.version_id
    assert shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")


@pytest.mark.slow
def test_killed_ray_driver_publishes_nothing_partial(local_ray: None, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    inputs = corpus(tmp_path, files=6)
    out = tmp_path / "ray"
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "ferry.shard_tools.cli", "pack", *inputs, "--out", str(out), "--vocab-size", "50257",
           "--eos-id", "50256", "--shard-size", "16KiB", "--name", "ray", "--executor", "ray",
           "--ray-address", address]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if (out / "shards").exists() and any((out / "shards").iterdir()):
            break  # tasks are writing shards: kill the driver now
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    if (out / "manifest.json").exists():  # it finished before the kill: then it must be whole
        assert verify(str(out)).ok
    else:  # a rerun of the same command publishes the same version as a local pack
        assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    local = pack(inputs, str(tmp_path / "local"), OPTS)
    assert open_dataset(str(out)).version_id == local.version_id and verify(str(out)).ok
