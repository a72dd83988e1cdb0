"""Local → local copies: in the kernel (copy_file_range) then hashed as landed; the mmap loop where the kernel can't."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import ferry.service.transfer.transfer as transfer
from ferry.shard_tools.errors import ShardDigestError, ShardFormatError, StorageError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve


def _setup(tmp_path: Path, size: int) -> tuple[Any, Any, bytes]:
    src, dst = resolve(str(tmp_path / "src")), resolve(str(tmp_path / "dst"))
    data = os.urandom(size)
    src.write_bytes("shards/a.bin", data)
    return src, dst, data


def _counting(monkeypatch: pytest.MonkeyPatch, fail: int | None = None) -> list[int]:
    calls: list[int] = []
    real = os.copy_file_range

    def fake(fd_in: int, fd_out: int, count: int, offset_src: Any = None, offset_dst: Any = None) -> int:
        calls.append(count)
        if fail is not None:
            raise OSError(fail, os.strerror(fail))
        return real(fd_in, fd_out, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", fake)
    return calls


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no copy_file_range on this platform")
def test_kernel_copy_in_chunks_with_progress_and_throttle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size, chunk = 5 * 2**20 + 17, 2**20
    src, dst, data = _setup(tmp_path, size)
    calls = _counting(monkeypatch)
    seen: list[int] = []
    taken: list[int] = []
    transfer.copy_shard(src, dst, "shards/a.bin", size, digest_bytes(data), chunk_size=chunk,
                        progress=seen.append, throttle=taken.append)  # fmt: skip
    assert calls == [chunk] * 5 + [17]  # the kernel did the copying, one chunk per call
    assert sum(seen) == sum(taken) == size
    assert dst.read_bytes("shards/a.bin") == data
    assert sorted(os.listdir(tmp_path / "dst" / "shards")) == ["a.bin"]  # no temp file left


@pytest.mark.parametrize("err", [errno.EXDEV, errno.EOPNOTSUPP, errno.ENOSYS])
def test_falls_back_to_the_mmap_loop_when_the_kernel_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    size = 3 * 2**20 + 5
    src, dst, data = _setup(tmp_path, size)
    calls = _counting(monkeypatch, fail=err)
    transfer.copy_shard(src, dst, "shards/a.bin", size, digest_bytes(data), chunk_size=2**20)
    assert len(calls) == 1 and dst.read_bytes("shards/a.bin") == data


def test_other_kernel_errors_fail_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst, data = _setup(tmp_path, 2**20)
    _counting(monkeypatch, fail=errno.EIO)
    with pytest.raises(StorageError, match="Input/output error"):
        transfer.copy_shard(src, dst, "shards/a.bin", 2**20, digest_bytes(data), chunk_size=2**18)
    assert not dst.exists("shards/a.bin") and not os.listdir(tmp_path / "dst" / "shards")


def test_a_rotten_source_never_reaches_the_final_name_after_the_kernel_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mmap loop the copy falls back to checks the bytes too (every path's own check of a rotten source:
    tests/contracts/copy_paths.py)."""
    size = 2 * 2**20 + 3
    src, dst, data = _setup(tmp_path, size)
    good = digest_bytes(data)
    src.write_bytes("shards/a.bin", data[:1000] + bytes([data[1000] ^ 0x40]) + data[1001:])  # one bit rots
    _counting(monkeypatch, fail=errno.EXDEV)
    with pytest.raises(ShardDigestError):
        transfer.copy_shard(src, dst, "shards/a.bin", size, good, chunk_size=2**20)
    with pytest.raises(ShardFormatError):
        transfer.copy_shard(src, dst, "shards/a.bin", size + 1, good, chunk_size=2**20)
    assert not os.listdir(tmp_path / "dst" / "shards")  # neither the shard nor a temp file
