"""The pure parts of remote fetching: the hedged race, the streaming shard sink, options and stats."""

from __future__ import annotations

import errno
import io
import pickle
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from ferry.client.fetching.fetch import FetchOptions, RaceLost, ShardSink, SourceFailed, race
from ferry.client.fetching.health import Link
from ferry.client.stats import Counters, merge, render_prometheus, subtract, summarise
from ferry.shard_tools.errors import ShardDigestError, ShardFormatError, ShardMissingError, StorageError, UsageError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.seekable import encode_shard_frames
from ferry.shard_tools.format.shard import compress, encode_shard


def _answer(value: bytes | BaseException, after: float = 0.0) -> Future[bytes]:
    fut: Future[bytes] = Future()

    def settle() -> None:
        if fut.set_running_or_notify_cancel():
            if isinstance(value, BaseException):
                fut.set_exception(value)
            else:
                fut.set_result(value)

    if after:
        threading.Timer(after, settle).start()
    else:
        settle()
    return fut


def _race(answers: dict[int, Future[bytes]], tries: list[int], deadline: float = 0.2, spare: int | None = None):
    started: list[int] = []
    hedged: list[int] = []
    errors: list[str] = []

    def start(i: int) -> Future[bytes]:
        started.append(i)
        return answers[i] if i not in started[:-1] else _answer(b"again")

    class Health:
        """Records what the race tells of each attempt; every deadline is ``deadline``."""

        def deadline(self, _i: int, _nbytes: int) -> float:
            return deadline

        def answered(self, *_: object) -> None:
            pass

        def refused(self, *_: object) -> None:
            pass

        def failed(self, _i: int, exc: BaseException, _s: float, _kind: str) -> str:
            errors.append(type(exc).__name__)
            return "missing" if isinstance(exc, FileNotFoundError) else "failed"

        def hedged(self, i: int) -> None:
            hedged.append(i)

        def unanswered(self, _replicas: list[int]) -> None:
            pass

    out = race(tries, start, None, Health(), nbytes=10, kind="shards", spare=spare)
    return out, started, hedged, errors


def test_a_hung_first_replica_costs_one_deadline_and_is_cancelled() -> None:
    hung: Future[bytes] = Future()
    t0 = time.perf_counter()
    (winner, data), started, hedged, _ = _race({0: hung, 1: _answer(b"ok", 0.01)}, [0, 1])
    assert (winner, data) == (1, b"ok") and started == [0, 1] and hedged == [0]
    assert 0.2 <= time.perf_counter() - t0 < 0.5
    assert hung.cancelled()


def test_an_error_moves_on_at_once_and_a_late_first_answer_still_wins() -> None:
    t0 = time.perf_counter()
    (winner, _), started, hedged, errors = _race({0: _answer(FileNotFoundError()), 1: _answer(b"b")}, [0, 1])
    assert winner == 1 and hedged == [] and errors == ["FileNotFoundError"] and time.perf_counter() - t0 < 0.1
    slow_b: Future[bytes] = Future()
    (winner, data), _, hedged, _ = _race({0: _answer(b"a", 0.3), 1: slow_b}, [0, 1])
    assert (winner, data) == (0, b"a") and hedged == [0] and slow_b.cancelled()


def test_a_single_replica_is_asked_once_more_then_the_race_is_lost() -> None:
    hung: Future[bytes] = Future()
    (winner, data), started, _, _ = _race({0: hung}, [0], spare=0)
    assert (winner, data, started) == (0, b"again", [0, 0])
    with pytest.raises(RaceLost) as lost:
        _race({0: Future(), 1: Future()}, [0, 1], deadline=0.05)
    assert lost.value.timed_out == 2 and "deadline" in str(lost.value)


def test_a_hung_replica_stays_behind_one_that_was_slow_once(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Replica 0 never answers; replica 1 then answers one read late (past its deadline). That read is hedged
    to a new connection of replica 1, not to replica 0, which never answered; and the read after it still
    goes to replica 1 first: being slow once does not put a replica behind one that hung."""
    from ferry.client.fetching import replicas as module

    urls = [str(tmp_path / "a"), str(tmp_path / "b")]
    replicas = module.Replicas(urls, fetch={"deadline_floor": 0.2, "deadline_slack": 0.01})
    asked: list[int] = []
    late = {1: 0.3}  # replica 1's second read answers after 0.3 s

    def start_read(loc, _rel, start, end, _pool, _direct=None):  # noqa: ANN001, ANN202 — stands in for ferry.client.fetching.fetch.start_read
        i = urls.index(loc.url)
        asked.append(i)
        if i == 0:
            return Future()  # hung: accepts, never answers
        return _answer(b"x" * (end - start), late.get(asked.count(1) - 1, 0.0))

    monkeypatch.setattr(module, "start_read", start_read)
    for _ in range(3):
        assert replicas.read_range("data", 0, 10) == b"x" * 10
    assert asked == [0, 1, 1, 1, 1], asked


def _stored(raw: bytes) -> tuple[ShardInfo, bytes]:
    stored = compress(raw, 3)
    info = ShardInfo("shards/x.arrow.zst", 1, 0, len(stored), len(raw), digest_bytes(stored), digest_bytes(raw))
    return info, stored


def _feed(info: ShardInfo, stored: bytes, part: int = 1000, *, pulled: bool = False) -> bytes:
    """The raw bytes a sink writes: ``stored`` pushed in parts (``feed``), or pulled from a file (``drain``)."""
    out = io.BytesIO()
    sink = ShardSink(info, out)
    if pulled:
        sink.drain(io.BytesIO(stored))
    else:
        for a in range(0, len(stored), part):
            sink.feed(stored[a : a + part])
    sink.finish()
    return out.getvalue()


@pytest.mark.parametrize("pulled", [False, True], ids=["fed", "drained"])
def test_the_sink_streams_a_shard_through_its_checks(pulled: bool) -> None:
    raw = encode_shard(np.arange(50_000) % 1000, np.array([0, 20_000, 50_000]), "uint16")
    info, stored = _stored(raw)
    assert _feed(info, stored, pulled=pulled) == raw
    flipped = bytearray(stored)
    flipped[len(stored) // 2] ^= 0xFF
    with pytest.raises((ShardDigestError, ShardFormatError)):
        _feed(info, bytes(flipped), pulled=pulled)
    with pytest.raises(ShardFormatError, match="truncated"):
        _feed(info, stored[:-10], pulled=pulled)
    with pytest.raises(ShardFormatError, match="longer"):
        _feed(info, stored + b"x", pulled=pulled)
    with pytest.raises(ShardFormatError, match="raw bytes"):
        _feed(
            ShardInfo(info.path, 1, 0, info.stored_bytes, info.raw_bytes + 1, info.stored_digest, info.raw_digest),
            stored,
            pulled=pulled,
        )
    with pytest.raises(ShardFormatError, match="not a valid zstd frame"):  # a good frame header, then garbage
        _feed(info, stored[:32] + bytes([0xFF]) * (len(stored) - 32), pulled=pulled)


def test_a_drained_shard_of_many_frames_and_buffers_decodes_whole_in_threads_side_by_side() -> None:
    """Shards larger than the thread's pull buffers, in the seekable format's frames, drained by two threads at
    once (each its own buffers) give exactly their raw bytes."""
    rng = np.random.default_rng(5)
    shards = []
    for seed in range(4):
        tokens = rng.integers(0, 50_000, 1_300_000 + seed * 1000)
        raw = encode_shard(tokens, np.array([0, len(tokens)]), "uint16")
        enc = encode_shard_frames(raw, 1, 1 << 18)
        info = ShardInfo(
            "shards/x.arrow.zst",
            1,
            len(tokens),
            enc.stored_bytes,
            len(raw),
            enc.stored_digest,
            enc.raw_digest,
            index_bytes=enc.index_bytes,
            index_digest=enc.index_digest,
            frame_size=1 << 18,
        )
        shards.append((raw, info, enc.stored))
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda s: _feed(s[1], s[2], pulled=True), shards * 2))
    assert [len(g) for g in got] == [len(s[0]) for s in shards * 2]
    assert all(g == s[0] for g, s in zip(got, shards * 2, strict=True))
    raw, info, stored = shards[0]
    short = ShardInfo(**{**vars(info), "raw_bytes": len(raw) - 1})  # its last frame decodes past the manifest's size
    for pulled in (False, True):
        with pytest.raises(ShardFormatError, match="yields more"):
            _feed(short, stored, 1 << 20, pulled=pulled)


def test_an_empty_stored_shard_drains_as_it_feeds() -> None:
    info = ShardInfo("shards/x.arrow.zst", 0, 0, 0, 0, digest_bytes(b""), digest_bytes(b""))
    assert _feed(info, b"", pulled=True) == _feed(info, b"") == b""


def test_a_source_that_fails_to_read_is_told_apart_from_bad_bytes() -> None:
    raw = encode_shard(np.arange(50_000) % 1000, np.array([0, 50_000]), "uint16")
    info, stored = _stored(raw)

    class Failing(io.BytesIO):
        def readinto(self, buf: Any) -> int:
            if self.tell() > 100:
                raise OSError(errno.EIO, "Input/output error")
            return super().readinto(memoryview(buf)[:50])

    with pytest.raises(SourceFailed):
        ShardSink(info, io.BytesIO()).drain(Failing(stored))
    with pytest.raises(ShardFormatError, match="decompression bomb"):
        ShardSink(ShardInfo(info.path, 1, 0, 10, 10**12, info.stored_digest, info.raw_digest), io.BytesIO())


def test_fetch_options_are_checked() -> None:
    assert FetchOptions.of({"part_size": "1MiB", "connections": 2}).part_size == 1 << 20
    for bad in ({"part_size": 10}, {"connections": 0}, {"deadline_floor": -1}, {"nope": 1}, [1]):
        with pytest.raises(UsageError):
            FetchOptions.of(bad)
    link = Link(FetchOptions())
    for _ in range(20):
        link.observe(1000, 0.03)
        link.observe(8 << 20, 0.03 + (8 << 20) / 40e6)
    assert link.latency == pytest.approx(0.03, rel=0.05) and link.rate == pytest.approx(40e6, rel=0.1)


def test_stats_add_up_across_processes_and_render() -> None:
    a, b = Counters(), Counters()
    base = a.snapshot()
    a.request("s3://x", 100, 0.015, "ok")
    b.request("s3://x", 50, 3.0, "ok")
    b.request("s3://x", 0, 1.0, "timed_out")
    b.hedged("s3://x")
    a.absorb(pickle.loads(pickle.dumps(subtract(b.snapshot(), Counters().snapshot()))))
    raw = merge(subtract(a.snapshot(), base), {"loop": {"stall_s": 1.0, "wall_s": 4.0, "delivered_bytes": 300}})
    s = summarise(raw)
    rep = s["replicas"]["s3://x"]
    assert (rep["requests"], rep["bytes"], rep["hedged"], rep["timed_out"]) == (3, 150, 1, 1)
    assert rep["latency_p50_s"] == 0.02 and rep["latency_p99_s"] == 5.0
    assert s["stall_share"] == 0.25 and s["downloaded_per_delivered"] == 0.5 and s["failed"] == 1
    text = render_prometheus(raw)
    assert 'ferry_loader_fetch_latency_seconds_bucket{replica="s3://x",le="+Inf"} 2' in text
    assert "ferry_loader_stall_seconds_total 1" in text


def test_ferry_errors_of_fetching_survive_pickling() -> None:
    for err in (
        ShardMissingError("shards/x", "no replica has a good copy: deadline"),
        StorageError("slow", retryable=True),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
