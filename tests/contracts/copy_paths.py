"""One shard copy (``ferry.service.transfer.transfer.copy_shard``), the same invariants on every copy path.

A copy path is a (source store, destination store) pair plus what picks the path inside ``copy_shard``: the
kernel copy or the mmap loop between local disks, object store → local disk, a presigned PUT, the store's own
PUT, a multipart upload, memory://. On each:

- the bytes arrive whole, checked against the digest; an empty shard too;
- bytes that do not match (a rotten source, a wrong size) never reach the final name, and nothing is left
  behind (no temp object, no open multipart upload);
- the final step is create-only: an object another writer stores at the name meanwhile is never replaced
  (WriteConflictError, not retryable, naming it), unless it holds the very bytes wanted (then the copy is
  done); one that vanishes again is a retryable error; only a repair (``create_only=False``) replaces;
- progress comes in small steps that add up to the size, at least every PROGRESS_SECONDS under a rate limit.

A subclass names the backends (conftest's ``<kind>_backend`` fixtures), the shard size and the setup that
selects its path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import ferry.service.transfer.transfer as transfer
from ferry.service.transfer import object_store
from ferry.service.transfer.bandwidth import TokenBucket
from ferry.service.transfer.hashed_io import PROGRESS_BYTES, PROGRESS_SECONDS
from ferry.service.transfer.object_store import skip_double_checksums
from ferry.shard_tools.errors import ShardDigestError, ShardFormatError, StorageError, WriteConflictError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import Location, resolve

PATH = "shards/a.bin"
SMALL = 2**20 + 7
MULTIPART = 11 * 2**20 + 5  # three parts above the single-PUT size a multipart path patches in
CHUNK = 2**18
PROGRESS_COPY_SECONDS = 1.0  # how long a rate-limited copy lasts: several progress periods


@dataclass(frozen=True)
class Pair:
    src: Location
    dst: Location


def _racing(loc: Location, data: bytes) -> Callable[[int], None]:
    """A throttle that, the first time the copy moves bytes, has another writer store ``data`` at the name."""
    done: list[bool] = []

    def throttle(n: int) -> None:
        if not done:
            done.append(True)
            loc.write_bytes(PATH, data)

    return throttle


def read_back(loc: Location) -> bytes:
    loc.fs.invalidate_cache()
    return loc.read_bytes(PATH)


class CopyPathContract:
    """``copy_shard`` over one path."""

    src_kind: ClassVar[str]
    dst_kind: ClassVar[str]
    size: ClassVar[int] = SMALL
    #: what selects the path: None, ``no_kernel_copy``, ``small_single_put`` or ``signed``
    setup: ClassVar[str | None] = None
    #: the path stores the shard in parts, each uploaded whole while the copy waits
    stores_in_parts: ClassVar[bool] = False

    @pytest.fixture(autouse=True)
    def _one_checksum(self) -> None:
        skip_double_checksums()  # as the daemon and `ferry sync` do before they open a store

    @pytest.fixture
    def pair(self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Pair:
        src_b = request.getfixturevalue(f"{self.src_kind}_backend")
        dst_b = src_b if self.dst_kind == self.src_kind else request.getfixturevalue(f"{self.dst_kind}_backend")
        if self.setup == "no_kernel_copy":
            monkeypatch.delattr(os, "copy_file_range", raising=False)
        if self.setup == "small_single_put":
            monkeypatch.setattr(object_store, "SINGLE_PUT_MAX", 5 * 2**20)
        extra = {"config_kwargs": {"s3": {"payload_signing_enabled": True}}} if self.setup == "signed" else {}
        src = resolve(src_b.url("src"), src_b.storage_options)
        dst = resolve(dst_b.url("dst"), {**dst_b.storage_options, **extra})
        return Pair(src, dst)

    def shard(self, pair: Pair, size: int | None = None) -> tuple[bytes, str]:
        """A shard of random bytes stored at the source: (its bytes, its digest)."""
        data = os.urandom(self.size if size is None else size)
        pair.src.write_bytes(PATH, data)
        return data, digest_bytes(data)

    def leftovers(self, dst: Location) -> list[str]:
        """Whatever a failed copy left at the destination: objects under shards/, open multipart uploads."""
        dst.fs.invalidate_cache()
        found = [str(p) for p in dst.fs.find(dst.full("shards"))] if dst.fs.exists(dst.full("shards")) else []
        if self.dst_kind == "s3":
            bucket = dst.root.split("/", 1)[0]
            found += [u["Key"] for u in dst.fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])]
        return found

    def test_the_bytes_arrive_whole_and_verified(self, pair: Pair) -> None:
        data, digest = self.shard(pair)
        outcome = transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK)
        assert outcome.bytes == len(data)
        assert read_back(pair.dst) == data

    def test_an_empty_shard_copies(self, pair: Pair) -> None:
        _, digest = self.shard(pair, 0)
        transfer.copy_shard(pair.src, pair.dst, PATH, 0, digest, chunk_size=CHUNK)
        assert read_back(pair.dst) == b""

    def test_a_rotten_source_never_reaches_the_final_name(self, pair: Pair) -> None:
        data, good = self.shard(pair)
        pair.src.write_bytes(PATH, data[:1000] + bytes([data[1000] ^ 0x40]) + data[1001:])  # one bit rots
        with pytest.raises(ShardDigestError):
            transfer.copy_shard(pair.src, pair.dst, PATH, len(data), good, chunk_size=CHUNK)
        with pytest.raises(ShardFormatError):  # the manifest's size disagrees with the stored object
            transfer.copy_shard(pair.src, pair.dst, PATH, len(data) + 1, good, chunk_size=CHUNK)
        assert self.leftovers(pair.dst) == []  # neither the shard nor a temp object nor an open upload

    def test_an_object_stored_meanwhile_with_other_bytes_is_not_replaced(self, pair: Pair) -> None:
        data, digest = self.shard(pair)
        theirs = bytes([data[0] ^ 0xFF]) + data[1:]  # same size, other bytes: another zstd level, say
        with pytest.raises(WriteConflictError) as caught:
            transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK,
                                throttle=_racing(pair.dst, theirs))  # fmt: skip
        assert f"{pair.dst.url}/{PATH}" in str(caught.value) and "never replaces" in str(caught.value)
        assert not caught.value.retryable
        assert read_back(pair.dst) == theirs

    def test_a_zero_byte_object_stored_meanwhile_is_not_replaced(self, pair: Pair) -> None:
        data, digest = self.shard(pair)
        with pytest.raises(WriteConflictError, match="0 bytes"):
            transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK,
                                throttle=_racing(pair.dst, b""))  # fmt: skip
        assert read_back(pair.dst) == b""

    def test_the_very_bytes_stored_meanwhile_count_as_copied(self, pair: Pair) -> None:
        data, digest = self.shard(pair)
        transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK,
                            throttle=_racing(pair.dst, data))  # fmt: skip
        assert read_back(pair.dst) == data

    def test_a_repair_replaces_the_object_at_the_name(self, pair: Pair) -> None:
        data, digest = self.shard(pair)
        pair.dst.write_bytes(PATH, data[: len(data) // 2])
        transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK, create_only=False)
        assert read_back(pair.dst) == data

    def test_an_object_that_appears_then_vanishes_is_a_retryable_error(
        self, pair: Pair, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The name was taken at the final step, gone when looked at: nothing was stored; a retry copies it."""
        data, digest = self.shard(pair)
        real = transfer.verify_shard

        def vanishing(loc: Location, path: str, *args: Any, **kw: Any) -> str | None:
            loc.remove(path)  # the other writer's object goes between the failed create and the look at it
            return real(loc, path, *args, **kw)

        monkeypatch.setattr(transfer, "verify_shard", vanishing)
        with pytest.raises(StorageError, match="vanished") as caught:
            transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK,
                                throttle=_racing(pair.dst, b"theirs"))  # fmt: skip
        assert caught.value.retryable
        monkeypatch.setattr(transfer, "verify_shard", real)
        transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK)
        assert read_back(pair.dst) == data

    def test_progress_comes_in_small_steps_at_least_every_period(self, pair: Pair) -> None:
        data, digest = self.shard(pair)
        rate = len(data) / PROGRESS_COPY_SECONDS
        calls: list[tuple[float, int]] = []

        def progress(n: int) -> None:
            calls.append((time.monotonic(), n))

        transfer.copy_shard(pair.src, pair.dst, PATH, len(data), digest, chunk_size=CHUNK,
                            throttle=TokenBucket(rate).take, progress=progress)  # fmt: skip
        assert read_back(pair.dst) == data
        sizes = [n for _, n in calls]
        # between reports while bytes move: the store's set-up before the first report and its finish before
        # the last (a single PUT of a held buffer, a multipart complete, a rename) move no bytes
        gaps = [b - a for (a, _), (b, _) in zip(calls[:-1], calls[1:-1], strict=False)]
        if self.stores_in_parts:  # each part's upload holds the copy up, and no bytes pass the throttle meanwhile
            parts = -(-len(data) // object_store.part_size(len(data), CHUNK))
            gaps = sorted(gaps)[: max(0, len(gaps) - parts)]
        assert sum(sizes) == len(data) and max(sizes) <= PROGRESS_BYTES
        # a flush is due PROGRESS_SECONDS after the last, and one throttle step (an eighth of that) may pass first
        assert max(gaps) < PROGRESS_SECONDS * 2, gaps
        assert len(sizes) >= PROGRESS_COPY_SECONDS / PROGRESS_SECONDS * 0.75, sizes
