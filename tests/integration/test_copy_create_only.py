"""A copy's final step at the destination is create-only: an object that another writer stores at the
shard's name while the copy runs (a ``ferry pack --append``, another daemon) is never replaced. Other
bytes there fail the copy (WriteConflictError, the object untouched); the very bytes wanted count as
done. Only a repair (``create_only=False``) replaces what stands at the name. Every copy path: local
kernel copy and mmap, object store → local disk, presigned PUT, the store's own PUT (from a local or a
remote source), the multipart upload, memory://, and GCS on fake-gcs-server / Azure Blob on Azurite
where installed (a GCS resumable upload is not covered: fake-gcs-server ignores its precondition)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

import ferry.service.transfer.transfer as transfer
from ferry.service.transfer import object_store
from ferry.service.transfer.object_store import skip_double_checksums
from ferry.shard_tools.errors import StorageError, WriteConflictError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import Location, resolve

PATH = "shards/a.bin"
SMALL = 3 * 2**20 + 7
CHUNK = 2**20


@pytest.fixture(autouse=True)
def _one_checksum() -> None:
    skip_double_checksums()


def _loc(backend: Any, name: str, **extra: Any) -> Location:
    return resolve(backend.url(name), {**backend.storage_options, **extra})


def _put(loc: Location, data: bytes) -> None:
    """Another writer stores ``data`` at the shard's name."""
    loc.write_bytes(PATH, data)


def _racing(loc: Location, data: bytes) -> Callable[[int], None]:
    """A throttle that, the first time the copy moves bytes, has another writer store ``data`` at the name."""
    done: list[bool] = []

    def throttle(n: int) -> None:
        if not done:
            done.append(True)
            _put(loc, data)

    return throttle


def _read(loc: Location) -> bytes:
    loc.fs.invalidate_cache()
    return loc.read_bytes(PATH)


# (source backend, destination backend, size, setup): one entry per copy path
PATHS = {
    "file-file-kernel": ("file", "file", SMALL, None),
    "file-file-mmap": ("file", "file", SMALL, "no_kernel_copy"),
    "s3-file": ("s3", "file", SMALL, None),
    "file-s3-presigned": ("file", "s3", SMALL, None),
    "file-s3-put": ("file", "s3", SMALL, "signed"),
    "file-s3-multipart": ("file", "s3", 11 * 2**20 + 5, "small_single_put"),
    "s3-s3-put": ("s3", "s3", SMALL, None),
    "file-memory": ("file", "memory", SMALL, None),
    "file-gcs-put": ("file", "gcs", SMALL, None),
    "memory-gcs-put": ("memory", "gcs", SMALL, None),
    "file-azure-put": ("file", "azure", SMALL, None),
    "memory-azure-put": ("memory", "azure", SMALL, None),
}


def _setup(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[Location, Location, bytes, str]:
    src_kind, dst_kind, size, setup = PATHS[name]
    src_b = request.getfixturevalue(f"{src_kind}_backend")
    dst_b = src_b if dst_kind == src_kind else request.getfixturevalue(f"{dst_kind}_backend")
    if setup == "no_kernel_copy":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    if setup == "small_single_put":
        monkeypatch.setattr(object_store, "SINGLE_PUT_MAX", 5 * 2**20)
    extra = {"config_kwargs": {"s3": {"payload_signing_enabled": True}}} if setup == "signed" else {}
    src = _loc(src_b, "src")
    dst = _loc(dst_b, "dst", **extra)
    data = os.urandom(size)
    src.write_bytes(PATH, data)
    return src, dst, data, digest_bytes(data)


@pytest.mark.parametrize("name", sorted(PATHS))
def test_an_object_stored_meanwhile_with_other_bytes_is_not_replaced(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst, data, digest = _setup(name, request, monkeypatch)
    theirs = bytes([data[0] ^ 0xFF]) + data[1:]  # same size, other bytes: another zstd level, say
    with pytest.raises(WriteConflictError) as caught:
        transfer.copy_shard(src, dst, PATH, len(data), digest, chunk_size=CHUNK, throttle=_racing(dst, theirs))
    assert f"{dst.url}/{PATH}" in str(caught.value) and "never replaces" in str(caught.value)
    assert not caught.value.retryable
    assert _read(dst) == theirs


@pytest.mark.parametrize("name", ["file-file-kernel", "s3-file", "file-s3-presigned", "file-s3-multipart",
                                  "file-memory", "memory-gcs-put"])  # fmt: skip
def test_the_very_bytes_stored_meanwhile_count_as_copied(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst, data, digest = _setup(name, request, monkeypatch)
    transfer.copy_shard(src, dst, PATH, len(data), digest, chunk_size=CHUNK, throttle=_racing(dst, data))
    assert _read(dst) == data


@pytest.mark.parametrize("name", ["file-file-kernel", "s3-file", "file-s3-presigned", "file-s3-multipart",
                                  "file-memory"])  # fmt: skip
def test_a_repair_replaces_the_object_at_the_name(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst, data, digest = _setup(name, request, monkeypatch)
    damaged = data[: len(data) // 2]
    dst.write_bytes(PATH, damaged)
    transfer.copy_shard(src, dst, PATH, len(data), digest, chunk_size=CHUNK, create_only=False)
    assert _read(dst) == data


def test_a_zero_byte_object_stored_meanwhile_is_not_replaced(file_backend: Any, s3_backend: Any) -> None:
    src = _loc(file_backend, "src")
    for dst in (_loc(file_backend, "dst"), _loc(s3_backend, "dst")):
        data = os.urandom(SMALL)
        src.write_bytes(PATH, data)
        with pytest.raises(WriteConflictError, match="0 bytes"):
            transfer.copy_shard(src, dst, PATH, len(data), digest_bytes(data), throttle=_racing(dst, b""))
        assert _read(dst) == b""


def test_a_directory_or_a_symlink_at_the_name_is_not_replaced(file_backend: Any, tmp_path: Any) -> None:
    src, dst = _loc(file_backend, "src"), _loc(file_backend, "dst")
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


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_an_object_that_appears_then_vanishes_is_a_retryable_error(
    kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name was taken at the final step, gone when looked at: nothing was stored; a retry copies it."""
    backend = request.getfixturevalue(f"{kind}_backend")
    src, dst = _loc(request.getfixturevalue("file_backend"), "src"), _loc(backend, "dst")
    data = os.urandom(SMALL)
    src.write_bytes(PATH, data)
    real = transfer.verify_shard

    def vanishing(loc: Location, path: str, *args: Any, **kw: Any) -> str | None:
        loc.remove(path)  # the other writer's object goes between the failed create and the look at it
        return real(loc, path, *args, **kw)

    monkeypatch.setattr(transfer, "verify_shard", vanishing)
    with pytest.raises(StorageError, match="vanished") as caught:
        transfer.copy_shard(src, dst, PATH, len(data), digest_bytes(data), throttle=_racing(dst, b"theirs"))
    assert caught.value.retryable
    monkeypatch.setattr(transfer, "verify_shard", real)
    transfer.copy_shard(src, dst, PATH, len(data), digest_bytes(data))
    assert _read(dst) == data


@pytest.mark.parametrize("name", ["file-azure-put", "memory-azure-put", "file-gcs-put", "memory-gcs-put", "s3-s3-put"])
def test_a_shard_copies_to_an_object_store_from_any_source(
    name: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-PUT path from a local or a remote source: the bytes arrive whole (Azure's client must accept
    the buffer a local shard is read into)."""
    src, dst, data, digest = _setup(name, request, monkeypatch)
    transfer.copy_shard(src, dst, PATH, len(data), digest, chunk_size=CHUNK)
    assert _read(dst) == data
