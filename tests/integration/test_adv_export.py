"""``ferry export`` never damages a previous export: the pair is written beside the targets
and renamed into place only when complete. Real subprocesses for the CLI."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ferry.shard_tools import PackOptions, open_dataset, pack_documents
from ferry.shard_tools.format.megatron import read_index, write_megatron

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
OPTS = PackOptions(vocab_size=500, eos_id=499, shard_size=2048, name="exp")


def ferry(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FERRY, *args], capture_output=True, text=True, timeout=timeout)


def dataset(tmp_path: Path, n: int = 80, seed: int = 0) -> tuple[str, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 499, size=int(rng.integers(1, 100))) for _ in range(n)]
    out = str(tmp_path / f"ds{seed}")
    pack_documents(docs, out, OPTS)
    return out, docs


def pair(prefix: Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def test_failed_export_keeps_the_previous_pair(tmp_path: Path) -> None:
    """Observed: the .bin was truncated in place, so a failed export destroyed the good one."""
    url, docs = dataset(tmp_path)
    (tmp_path / "out").mkdir()
    prefix = tmp_path / "out" / "mg"
    assert ferry("export", url, "--format", "megatron", "--out", str(prefix)).returncode == 0
    before = pair(prefix)
    # corrupt the last shard: the export fails after writing every earlier document
    shards = open_dataset(url).manifest.shards
    assert len(shards) > 2
    shard = Path(url) / shards[-1].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    proc = ferry("export", url, "--format", "megatron", "--out", str(prefix))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and shards[-1].path in proc.stderr
    assert pair(prefix) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mg.bin", "mg.idx"]  # no temp left


def failing(docs: list[np.ndarray], after: int) -> Iterator[np.ndarray]:
    for i, doc in enumerate(docs):
        if i == after:
            raise OSError("injected read failure")
        yield doc


@pytest.mark.parametrize("after", [0, 5])
def test_error_mid_write_leaves_no_temp_and_the_old_pair(tmp_path: Path, after: int) -> None:
    prefix = tmp_path / "mg"
    old = [np.arange(7), np.arange(3)]
    write_megatron(str(prefix), old, np.dtype(np.uint16))
    before = pair(prefix)
    new = [np.full(50, i) for i in range(10)]
    with pytest.raises(OSError, match="injected"):
        write_megatron(str(prefix), failing(new, after), np.dtype(np.uint16))
    assert pair(prefix) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mg.bin", "mg.idx"]


def test_export_replaces_a_previous_pair_whole(tmp_path: Path) -> None:
    """A re-export of a different dataset to the same prefix: the new pair, consistent."""
    (tmp_path / "out").mkdir()
    prefix = tmp_path / "out" / "mg"
    for seed in (0, 1):
        url, docs = dataset(tmp_path, n=40 + 30 * seed, seed=seed)
        proc = ferry("export", url, "--format", "megatron", "--out", str(prefix), "--strip-eos")
        assert proc.returncode == 0, proc.stderr
        index = read_index(str(prefix))
        assert index.lengths.tolist() == [len(d) for d in docs]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mg.bin", "mg.idx"]


def test_export_onto_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    url, _ = dataset(tmp_path, n=10)
    (tmp_path / "mg.idx").mkdir()
    proc = ferry("export", url, "--format", "megatron", "--out", str(tmp_path / "mg"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "mg.idx" in proc.stderr and not (tmp_path / "mg.bin").exists()


def test_export_into_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    url, _ = dataset(tmp_path, n=10)
    (tmp_path / "afile").write_bytes(b"")
    proc = ferry("export", url, "--format", "megatron", "--out", str(tmp_path / "afile" / "mg"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "afile" in proc.stderr


def test_large_vocabulary_exports_as_int32(tmp_path: Path) -> None:
    """A uint32 dataset (vocabulary over 65536) exports as int32: Megatron has no uint32 code."""
    docs = [np.array([1, 70_000, 99_998]), np.array([5])]
    url = str(tmp_path / "ds")
    pack_documents(docs, url, PackOptions(vocab_size=100_000, eos_id=99_999, name="big"))
    proc = ferry("export", url, "--format", "megatron", "--out", str(tmp_path / "mg"), "--strip-eos")
    assert proc.returncode == 0, proc.stderr
    index = read_index(str(tmp_path / "mg"))
    assert index.dtype == np.int32 and index.lengths.tolist() == [3, 1]
    tokens = np.fromfile(tmp_path / "mg.bin", dtype=np.int32)
    assert tokens.tolist() == [1, 70_000, 99_998, 5]
