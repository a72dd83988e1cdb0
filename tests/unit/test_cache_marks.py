"""A cache file checked by one process is not hashed again by the next (a DataLoader worker of the next epoch),
while the file is as it was when checked; a file changed since is hashed again, and fetched again when bad."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from scripts.loader_common import pack_test_dataset

from ferry.client.fetching import cache as cache_mod
from ferry.client.fetching.cache import ShardCache
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.dataset import open_dataset


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_test_dataset(str(tmp_path_factory.mktemp("marks") / "ds"), 200, shard_size=1 << 14)


def _process(local: str, directory: Path) -> ShardCache:
    """A cache as a new process makes it: nothing checked by this process yet."""
    return ShardCache(str(directory), 1 << 30, Replicas(local), dtype=open_dataset(local).manifest.token_dtype)


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    digest = cache_mod._file_digest

    def counted(path: str, info: object) -> str:
        calls.append(path)
        return digest(path, info)  # type: ignore[arg-type]

    monkeypatch.setattr(cache_mod, "_file_digest", counted)
    return calls


def test_a_file_checked_by_one_process_is_not_hashed_by_the_next(
    local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = _hashes(monkeypatch)
    info = open_dataset(local).manifest.shards[0]
    first = _process(local, tmp_path)
    first.open(info).release()  # downloaded (checked as it streamed), opened (touched)
    assert first.fetches == 1 and hashed == []
    for _ in range(3):  # one new process per epoch, each opening the shard (and touching it)
        again = _process(local, tmp_path)
        again.open(info).release()
        assert again.fetches == 0
    assert hashed == []  # before: each new process hashed the file again


def test_a_file_changed_after_its_check_is_hashed_and_fetched_again(
    local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = _hashes(monkeypatch)
    info = open_dataset(local).manifest.shards[1]
    first = _process(local, tmp_path)
    first.open(info).release()
    path = first.path(info)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:  # in place, same size and inode, right after the mark
        f.write(bytes(data))
    again = _process(local, tmp_path)
    again.open(info).release()
    assert hashed and set(hashed) == {path} and again.fetches == 1  # hashed (and again under the lock), fetched
    assert Path(path).read_bytes() != bytes(data)


def test_a_hand_written_mark_of_another_file_is_not_taken(
    local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = open_dataset(local).manifest.shards[1]
    first = _process(local, tmp_path)
    first.open(info).release()
    mark = Path(first._mark_file(info))
    st = os.stat(first.path(info))
    mark.write_text(f"{info.frame_size + 1}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")  # other shape
    hashed = _hashes(monkeypatch)
    _process(local, tmp_path).open(info).release()
    assert set(hashed) == {first.path(info)}
