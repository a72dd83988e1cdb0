"""Every copy path keeps the contract of tests/contracts/copy_paths.py (verified bytes, a create-only final
step, nothing partial under a final name, fine-grained progress): one subclass per path. GCS on
fake-gcs-server and Azure Blob on Azurite run where installed (a GCS resumable upload is not covered:
fake-gcs-server ignores its precondition). Checks that only one path has stay beside it."""

from __future__ import annotations

import os
from typing import Any

import pytest
from contracts.copy_paths import MULTIPART, PATH, SMALL, CopyPathContract

import ferry.service.transfer.transfer as transfer
from ferry.shard_tools.errors import WriteConflictError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import resolve


class TestCopyLocalKernel(CopyPathContract):
    src_kind = dst_kind = "file"


class TestCopyLocalMmap(CopyPathContract):
    src_kind = dst_kind = "file"
    setup = "no_kernel_copy"


class TestCopyS3ToLocal(CopyPathContract):
    src_kind, dst_kind = "s3", "file"


class TestCopyLocalToS3Presigned(CopyPathContract):
    src_kind, dst_kind = "file", "s3"


class TestCopyLocalToS3Put(CopyPathContract):
    src_kind, dst_kind = "file", "s3"
    setup = "signed"


class TestCopyLocalToS3Multipart(CopyPathContract):
    src_kind, dst_kind = "file", "s3"
    size = MULTIPART
    setup = "small_single_put"
    stores_in_parts = True


class TestCopyS3ToS3Put(CopyPathContract):
    src_kind = dst_kind = "s3"


class TestCopyLocalToMemory(CopyPathContract):
    src_kind, dst_kind = "file", "memory"


class TestCopyLocalToGcsPut(CopyPathContract):
    src_kind, dst_kind = "file", "gcs"


class TestCopyMemoryToGcsPut(CopyPathContract):
    src_kind, dst_kind = "memory", "gcs"


class TestCopyLocalToAzurePut(CopyPathContract):
    src_kind, dst_kind = "file", "azure"


class TestCopyMemoryToAzurePut(CopyPathContract):
    src_kind, dst_kind = "memory", "azure"


def test_a_directory_or_a_symlink_at_the_name_is_not_replaced(file_backend: Any, tmp_path: Any) -> None:
    src, dst = resolve(file_backend.url("src")), resolve(file_backend.url("dst"))
    data = os.urandom(SMALL)
    src.write_bytes(PATH, data)
    target = dst.full(PATH)
    good = tmp_path / "elsewhere.bin"
    good.write_bytes(data)  # the very bytes, but through a link: not a shard object ferry stored

    def directory(n: int) -> None:
        os.makedirs(target, exist_ok=True)

    def symlink(n: int) -> None:
        if not os.path.lexists(target):
            os.symlink(good, target)

    with pytest.raises(WriteConflictError, match="directory"):
        transfer.copy_shard(src, dst, PATH, len(data), digest_bytes(data), throttle=directory)
    assert os.path.isdir(target)
    os.rmdir(target)
    with pytest.raises(WriteConflictError, match="symbolic link"):
        transfer.copy_shard(src, dst, PATH, len(data), digest_bytes(data), throttle=symlink)
    assert os.path.islink(target) and os.readlink(target) == str(good)
    assert not [n for n in os.listdir(os.path.dirname(target)) if n != "a.bin"], "a temp file was left behind"
