"""A dataset whose one replica is on a local disk: a whole shard is read by the thread that fetches it, and its
frames by the thread that reads them, through the same checks as a remote one; what it cannot read goes the usual
way (the replica race) to its error. A network mount keeps the race, whose deadlines bound a read that hangs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader
from ferry.client.fetching import local
from ferry.client.fetching.frames import frame_reader_for
from ferry.client.fetching.local import LocalRanges, mount_type, on_local_disk
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.dataset import decode_stored_shard
from ferry.shard_tools.errors import ShardError, ShardFormatError, ShardMissingError
from ferry.shard_tools.format.manifest import ShardInfo


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Replicas, ShardInfo, Path]:
    url = pack_test_dataset(str(tmp_path / "ds"), n_docs=200)
    replicas = Replicas(url)
    info = replicas.load_manifest().shards[0]
    return replicas, info, tmp_path / "ds" / info.path


def _raced(replicas: Replicas, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths this object reads through the replica race from now on."""
    asked: list[str] = []
    real = replicas._read

    def counted(rel: str, *a: Any, **k: Any) -> Any:
        asked.append(rel)
        return real(rel, *a, **k)

    monkeypatch.setattr(replicas, "_read", counted)
    return asked


def test_a_local_shard_is_read_whole_by_the_fetching_thread(
    dataset: tuple[Replicas, ShardInfo, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas, info, stored = dataset
    asked = _raced(replicas, monkeypatch)
    out = io.BytesIO()
    replicas.fetch_into(info, out)
    assert out.getvalue() == decode_stored_shard(info, stored.read_bytes())
    assert asked == []  # no part went through the race's threads


class _Counted(io.BytesIO):
    """A cache file that counts its truncations."""

    truncations = 0

    def truncate(self, size: int | None = None) -> int:
        self.truncations += 1
        return super().truncate(size)


def test_a_fetch_truncates_only_a_file_a_failed_read_wrote_to(
    dataset: tuple[Replicas, ShardInfo, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty cache file is written as it is (ext4 writes a truncated file back when it is closed, in the
    closing thread); a local read that fails once it has written leaves nothing behind for the race's copy."""
    replicas, info, stored = dataset
    raw = decode_stored_shard(info, stored.read_bytes())
    out = _Counted()
    replicas.fetch_into(info, out)
    assert out.getvalue() == raw and out.truncations == 0

    class FailsSecondRead(io.FileIO):
        reads = 0

        def readinto(self, buf: Any) -> int:
            FailsSecondRead.reads += 1
            if FailsSecondRead.reads == 2:
                raise OSError(5, "Input/output error")
            return super().readinto(memoryview(buf)[: max(1, info.stored_bytes // 2)])

    real_fdopen = os.fdopen
    monkeypatch.setattr(
        "ferry.client.fetching.replicas.os.fdopen",
        lambda fd, *a, **k: FailsSecondRead(fd, "rb") if a[:1] == ("rb",) else real_fdopen(fd, *a, **k),
    )
    asked = _raced(replicas, monkeypatch)
    out = _Counted()
    replicas.fetch_into(info, out)
    assert FailsSecondRead.reads == 2 and asked == [info.path]  # the local read failed; the race read it
    assert out.getvalue() == raw and out.truncations == 1


@pytest.mark.parametrize("spoil", ["flip", "truncate", "longer"])
def test_a_spoilt_local_shard_is_refused_naming_it(
    dataset: tuple[Replicas, ShardInfo, Path], spoil: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas, info, stored = dataset
    good = stored.read_bytes()
    stored.write_bytes(
        {
            "flip": good[:-40] + bytes([good[-40] ^ 1]) + good[-39:],
            "truncate": good[: len(good) // 2],
            "longer": good + b"\0",
        }[spoil]
    )
    _raced(replicas, monkeypatch)
    out = io.BytesIO()
    with pytest.raises(ShardError, match="no replica has a good copy") as caught:
        replicas.fetch_into(info, out)
    assert info.path in str(caught.value)
    if spoil != "flip":
        assert isinstance(caught.value, ShardFormatError)


def test_a_local_shard_that_is_missing_or_unreadable_goes_through_the_race(
    dataset: tuple[Replicas, ShardInfo, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas, info, stored = dataset
    stored.unlink()
    asked = _raced(replicas, monkeypatch)
    with pytest.raises(ShardMissingError, match=info.path.split("/")[-1]):
        replicas.fetch_into(info, io.BytesIO())
    assert info.path in asked  # the race read it, and named what it found


@pytest.mark.parametrize("stand_in", ["fifo", "device", "directory"])
def test_a_fifo_device_or_directory_in_a_shards_place_is_refused_at_once(tmp_path: Path, stand_in: str) -> None:
    """Opening a FIFO for reading waits for a writer for ever, and a device never ends: each is named as not a
    shard, at once, whether the shard is read whole or by frames."""
    url = pack_test_dataset(str(tmp_path / "ds"), n_docs=300)
    stored = tmp_path / "ds" / Replicas(url).load_manifest().shards[0].path
    stored.unlink()
    if stand_in == "fifo":
        os.mkfifo(stored)
    elif stand_in == "device":
        stored.symlink_to("/dev/zero")
    else:
        stored.mkdir()
    outcome: list[BaseException | None] = []

    def epoch() -> None:
        try:
            ds = TokenDataset(url, seq_len=64, cache_dir=str(tmp_path / "cache"))
            for _ in TokenLoader(ds, batch_size=4):
                pass
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 — handed to the test's thread
            outcome.append(exc)

    reader = threading.Thread(target=epoch, daemon=True)
    started = time.monotonic()
    reader.start()
    reader.join(30)
    assert outcome, "the loader hung on a FIFO"
    assert time.monotonic() - started < 10  # not a deadline's wait: the file is refused when opened
    assert isinstance(outcome[0], ShardFormatError) and "not a regular file" in str(outcome[0])


_OUT_OF_DESCRIPTORS = """
import os, resource, sys
from ferry.client.fetching.local import LocalRanges
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.storage.store import resolve
replicas = Replicas(sys.argv[1])
shards = replicas.load_manifest().shards
reader = LocalRanges(resolve(sys.argv[1], None))
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 8, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
for k in range(len(shards)):  # more shards than descriptors are left: each kept until the process runs out
    assert len(reader(shards[k], 0, 16)) == 16
print("read", len(shards))
"""


def test_a_reader_out_of_descriptors_closes_its_own_and_reads_on(tmp_path: Path) -> None:
    url = pack_test_dataset(str(tmp_path / "ds"), n_docs=400, shard_size=1024)
    count = len(Replicas(url).load_manifest().shards)
    assert count > 16
    done = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS, url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["read", str(count)]


def test_a_second_replica_keeps_the_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With another replica to hedge to, a local one is read through the race, which can give up on it."""
    a = pack_test_dataset(str(tmp_path / "a"), n_docs=200)
    b = pack_test_dataset(str(tmp_path / "b"), n_docs=200)
    replicas = Replicas([a, b])
    info = replicas.load_manifest().shards[0]
    asked = _raced(replicas, monkeypatch)
    out = io.BytesIO()
    replicas.fetch_into(info, out)
    assert out.getvalue() == decode_stored_shard(info, (tmp_path / "a" / info.path).read_bytes())
    assert info.path in asked


_MOUNTS = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:40 / /scratch rw,relatime - xfs /dev/vdb rw
41 40 0:41 / /scratch/team\\040data rw,relatime - nfs4 filer:/export rw
42 27 0:42 / /lus rw - lustre 10.0.0.1@tcp:/fs rw
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/", "ext4"),
        ("/home/me/ds", "ext4"),
        ("/scratch/ds", "xfs"),
        ("/scratch/team data/ds", "nfs4"),  # the longest mount point, its name unescaped
        ("/scratch/team datax", "xfs"),  # a prefix of a name is not its mount point
        ("/lus/x", "lustre"),
    ],
)
def test_the_mount_that_holds_a_path_is_its_longest_mount_point(path: str, kind: str) -> None:
    assert mount_type(path, _MOUNTS) == kind


def test_only_disk_filesystems_are_read_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert on_local_disk(str(tmp_path))  # the test machine's own disk
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"1 0 0:1 / / rw - ext4 /dev/a rw\n2 1 0:2 / {tmp_path} rw - nfs4 srv:/e rw\n")
    monkeypatch.setattr(local, "_MOUNTINFO", str(mountinfo))
    assert not on_local_disk(str(tmp_path / "ds"))
    monkeypatch.setattr(local, "_MOUNTINFO", str(tmp_path / "none"))  # no mount table: not known to be a disk
    assert not on_local_disk(str(tmp_path))


def test_a_dataset_on_a_network_mount_keeps_the_race(
    dataset: tuple[Replicas, ShardInfo, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replicas, info, stored = dataset
    assert replicas.direct()  # on this machine's disk; decided once, before the mount table below
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"1 0 0:1 / / rw - ext4 /dev/a rw\n2 1 0:2 / {tmp_path} rw - lustre srv:/fs rw\n")
    monkeypatch.setattr(local, "_MOUNTINFO", str(mountinfo))
    remade = Replicas(str(stored.parents[1]))
    assert not remade.direct()
    asked = _raced(remade, monkeypatch)
    out = io.BytesIO()
    remade.fetch_into(info, out)
    assert out.getvalue() == decode_stored_shard(info, stored.read_bytes())
    assert info.path in asked
    reader = frame_reader_for(remade.load_manifest(), remade, 64 << 20)
    assert reader is not None and not isinstance(reader.read_range, LocalRanges)
    direct = frame_reader_for(replicas.load_manifest(), replicas, 64 << 20)
    assert direct is not None and isinstance(direct.read_range, LocalRanges)


@pytest.mark.parametrize("reserved", [True, False])
def test_the_node_cache_reserves_a_shards_blocks_before_writing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reserved: bool
) -> None:
    """Each cache file is given its shard's raw size in blocks, still empty, before the fetch writes it; where
    the filesystem reserves nothing the shards arrive the same."""
    from ferry.client.fetching import cache as cache_module

    url = pack_test_dataset(str(tmp_path / "ds"), n_docs=200)
    calls: list[tuple[int, int]] = []
    real = cache_module.reserve_blocks

    def spy(fd: int, nbytes: int) -> bool:
        calls.append((os.fstat(fd).st_size, nbytes))
        return real(fd, nbytes) if reserved else False

    monkeypatch.setattr(cache_module, "reserve_blocks", spy)
    ds = TokenDataset(url, seq_len=16, cache_dir=str(tmp_path / "cache"))
    for s in range(len(ds.manifest.shards)):
        ds.reader.view(s)  # fetched whole into the node cache
    shards = ds.manifest.shards
    assert sorted(calls) == sorted((0, shards[s].raw_bytes) for s in range(len(shards)))
    for s in range(len(shards)):
        stored = (tmp_path / "ds" / shards[s].path).read_bytes()
        cached = ds.reader.cache.path(shards[s])
        assert Path(cached).read_bytes() == decode_stored_shard(shards[s], stored)
    ds.close()
