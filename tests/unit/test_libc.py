"""The libc calls ``os`` does not offer: reserving a file's blocks without changing its size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ferry.shard_tools import libc


def test_reserved_blocks_keep_the_files_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with open(path, "wb") as f:
        assert libc.reserve_blocks(f.fileno(), 1 << 20)
        st = os.fstat(f.fileno())
        assert st.st_size == 0  # a reader still sees an empty file
        assert st.st_blocks * 512 >= 1 << 20  # the blocks are the file's
        f.write(b"x" * 1000)
    assert path.read_bytes() == b"x" * 1000


def test_nothing_is_reserved_where_it_cannot_be(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "f", "wb") as f:
        assert not libc.reserve_blocks(f.fileno(), 0)
    r, w = os.pipe()
    try:
        assert not libc.reserve_blocks(w, 4096)  # not a file: the call refuses it, nothing raises
    finally:
        os.close(r)
        os.close(w)
    monkeypatch.setattr(libc, "symbol", lambda name: None)  # no such call in this libc
    with open(tmp_path / "g", "wb") as f:
        assert not libc.reserve_blocks(f.fileno(), 4096)
        assert os.fstat(f.fileno()).st_blocks == 0
