"""The node's record of a remote shard's stored bytes that arrived before the shard is whole in the cache: spans
cut and joined, torn records ignored, claims that count only while their fill runs, waits that end."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from ferry.client.fetching.arrived import ArrivedBytes, covers, merge, pieces
from ferry.shard_tools.format.manifest import ShardInfo

INFO = ShardInfo(
    path="shards/s0.arrow.zst",
    documents=1,
    tokens=1,
    stored_bytes=1000,
    raw_bytes=2000,
    stored_digest="blake2b:" + "ab" * 16,
    raw_digest="blake2b:" + "cd" * 16,
)


def test_pieces_cut_a_span_along_what_arrived() -> None:
    have = merge([(50, 60), (10, 20), (18, 30), (100, 200)])
    assert have == [(10, 30), (50, 60), (100, 200)]
    assert pieces(0, 120, have) == [
        (0, 10, False),
        (10, 30, True),
        (30, 50, False),
        (50, 60, True),
        (60, 100, False),
        (100, 120, True),
    ]
    assert pieces(12, 28, have) == [(12, 28, True)]
    assert pieces(200, 300, have) == [(200, 300, False)]
    assert covers(have, 100, 200) and not covers(have, 25, 55)


def test_kept_bytes_read_back_and_a_torn_or_foreign_record_names_nothing(tmp_path: Path) -> None:
    arrived = ArrivedBytes(str(tmp_path))
    arrived.keep(INFO, 100, b"x" * 50)
    arrived.keep(INFO, 990, b"y" * 50)  # past the stored end: cut to it
    assert arrived.spans(INFO) == [(100, 150), (990, 1000)]
    assert arrived.read(INFO, 110, 140) == b"x" * 30
    assert arrived.read(INFO, 140, 160) is None  # not all of it arrived
    have = next(tmp_path.glob("arrived/*.have"))
    with open(have, "ab") as f:
        f.write(b"\x00" * 24 + b"\x01" * 13)  # a record of garbage, then a torn one
    assert arrived.spans(INFO) == [(100, 150), (990, 1000)]
    arrived.drop(INFO)
    assert arrived.spans(INFO) == [] and arrived.read(INFO, 110, 140) is None


def test_a_digest_that_is_not_hex_keeps_nothing(tmp_path: Path) -> None:
    bad = ShardInfo(**{**INFO.__dict__, "stored_digest": "blake2b:../../etc"})
    arrived = ArrivedBytes(str(tmp_path))
    arrived.keep(bad, 0, b"x" * 10)
    assert arrived.spans(bad) == [] and not (tmp_path / "arrived").exists()


def test_a_claim_counts_only_while_its_fill_runs(tmp_path: Path) -> None:
    arrived = ArrivedBytes(str(tmp_path))
    arrived.claim(INFO, 0, 500)
    assert arrived.state(INFO) == ([], [(0, 500)])
    assert not arrived.fill_live(INFO)
    t0 = time.monotonic()
    arrived.wait(INFO, 10, 20)  # no fill runs: returns at once
    assert time.monotonic() - t0 < 0.5
    with arrived.filling(INFO):
        assert arrived.fill_live(INFO)

        def arrive() -> None:
            time.sleep(0.3)
            arrived.keep(INFO, 0, b"z" * 500)

        thread = threading.Thread(target=arrive)
        thread.start()
        have = arrived.wait(INFO, 10, 20)
        thread.join()
    assert covers(have, 10, 20)
    assert not arrived.fill_live(INFO)


def test_a_wait_ends_when_the_fill_ends_without_the_bytes(tmp_path: Path) -> None:
    arrived = ArrivedBytes(str(tmp_path))
    held = threading.Event()
    release = threading.Event()

    def fill() -> None:
        with arrived.filling(INFO):
            arrived.claim(INFO, 0, 500)
            held.set()
            release.wait(10)

    thread = threading.Thread(target=fill)
    thread.start()
    assert held.wait(10)
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    have = arrived.wait(INFO, 10, 20, limit=5.0)
    thread.join()
    assert not covers(have, 10, 20)
    assert 0.2 < time.monotonic() - t0 < 3.0


def test_a_wait_is_bounded(tmp_path: Path) -> None:
    arrived = ArrivedBytes(str(tmp_path))
    with arrived.filling(INFO):
        arrived.claim(INFO, 0, 500)
        t0 = time.monotonic()
        arrived.wait(INFO, 10, 20, limit=0.2)
        assert 0.15 < time.monotonic() - t0 < 2.0


def test_held_counts_blocks_not_the_sparse_length(tmp_path: Path) -> None:
    arrived = ArrivedBytes(str(tmp_path))
    big = ShardInfo(**{**INFO.__dict__, "stored_bytes": 1 << 30})
    arrived.keep(big, (1 << 30) - 4096, b"x" * 4096)
    [(_, size, name)] = arrived.held()
    assert 4096 <= size < 1 << 20
    arrived.remove(name)
    assert arrived.held() == []


def test_a_fill_lock_file_that_cannot_be_made_means_no_live_fill(tmp_path: Path) -> None:
    (tmp_path / ".locks").write_text("a file where the lock directory goes")
    arrived = ArrivedBytes(str(tmp_path))
    with arrived.filling(INFO):
        assert not arrived.fill_live(INFO)


def test_a_directory_that_cannot_be_made_keeps_nothing_and_raises_nothing(tmp_path: Path) -> None:
    (tmp_path / "arrived").write_text("a file where the directory goes")
    arrived = ArrivedBytes(str(tmp_path))
    arrived.keep(INFO, 0, b"x" * 10)
    arrived.claim(INFO, 0, 10)
    assert arrived.state(INFO) == ([], []) and arrived.held() == []


def test_the_fill_lock_is_an_flock_other_processes_see(tmp_path: Path) -> None:
    arrived = ArrivedBytes(str(tmp_path))
    with arrived.filling(INFO):
        lock = next((tmp_path / ".locks").glob("*.fill"))
        fd = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_a_fill_that_brings_nothing_is_waited_for_once(tmp_path: Path) -> None:
    """A filler frozen with its lock held (SIGSTOP, a hung read) costs a process one bounded wait, not one per
    frame read."""
    arrived = ArrivedBytes(str(tmp_path))
    with arrived.filling(INFO):
        arrived.claim(INFO, 0, 500)
        t0 = time.monotonic()
        arrived.wait(INFO, 10, 20, limit=0.3)
        first = time.monotonic() - t0
        t0 = time.monotonic()
        for a in range(30, 330, 30):
            arrived.wait(INFO, a, a + 10, limit=0.3)
        rest = time.monotonic() - t0
    assert first >= 0.25 and rest < 0.25, (first, rest)


def test_a_filler_killed_mid_fill_ends_the_wait_at_once(tmp_path: Path) -> None:
    """SIGKILL (a preempted DataLoader worker) releases the fill's flock with the process: a reader waiting on
    its claim reads on at once instead of running out its wait."""
    import signal
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent(
        f"""
        import sys, time
        from ferry.client.fetching.arrived import ArrivedBytes
        from ferry.shard_tools.format.manifest import ShardInfo
        info = ShardInfo(**{INFO.__dict__!r})
        arrived = ArrivedBytes({str(tmp_path)!r})
        with arrived.filling(info):
            arrived.claim(info, 0, 500)
            print("filling", flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "filling"
        arrived = ArrivedBytes(str(tmp_path))
        assert arrived.fill_live(INFO)
        threading.Timer(0.3, proc.send_signal, (signal.SIGKILL,)).start()
        t0 = time.monotonic()
        have = arrived.wait(INFO, 10, 20, limit=20.0)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait(10)
    assert not covers(have, 10, 20)
    assert 0.2 < waited < 5.0, waited
    assert not arrived.fill_live(INFO)
