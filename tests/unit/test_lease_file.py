"""What a lease file may say: a lease that cannot expire counts as expired, values print bounded
and escaped, and a holder is judged by its full identity (issue 24, items 2 and 8)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ferry.service.replication.lease import (
    LEASE_FILE,
    MAX_LEASE_BYTES,
    MAX_TTL,
    Lease,
    LeaseInfo,
    break_lease,
    read_lease,
    view_lease,
)
from ferry.shard_tools.errors import StorageError
from ferry.shard_tools.storage.store import (
    STALE_TEMP_SECONDS,
    TEMP_MARKER,
    Location,
    resolve,
    temp_is_stale,
    temp_name,
    temp_writer,
    this_writer,
)

VALID = {"holder": "daemon:elsewhere:42:abcd1234", "kind": "daemon", "host": "elsewhere", "pid": 42,
         "acquired_at": 0.0, "expires_at": 0.0}  # fmt: skip


def body(**changes: Any) -> bytes:
    doc = {**VALID, "acquired_at": time.time(), "expires_at": time.time() + 30, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


def raw(text: str) -> bytes:
    now = time.time()
    return (
        '{"holder": "daemon:elsewhere:42:abcd1234", "kind": "daemon", "host": "elsewhere", "pid": 42, '
        f'"acquired_at": {now}, "expires_at": {text}}}'
    ).encode()


INVALID = {
    "nan": raw("NaN"),
    "infinity": raw("Infinity"),
    "minus infinity": raw("-Infinity"),
    "1e308": raw("1e308"),
    "1e400": raw("1e400"),
    "400 digits": raw("1" + "0" * 400),
    "negative": raw("-5"),
    "a string": raw('"soon"'),
    "true": raw("true"),
    "a year ahead": raw(str(time.time() + 365 * 86400)),
    "missing holder": body(holder=...),
    "missing expiry": body(expires_at=...),
    "pid as string": body(pid="42"),
    "pid zero": body(pid=0),
    "pid bool": body(pid=True),
    "host not a string": body(host=["x"]),
    "ns not a string": body(ns=5),
    "start negative": body(start=-1),
    "garbage": b"\x00\xff garbage {",
    "not utf-8": b'{"holder": "\xff"}',
    "a list": b"[1, 2]",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "huge": body(padding="x" * (MAX_LEASE_BYTES + 1)),
    "empty": b"",
}


@pytest.fixture
def loc(tmp_path: Path) -> Location:
    return resolve(str(tmp_path / "dst"))


def put(loc: Location, data: bytes) -> None:
    loc.write_bytes(LEASE_FILE, data)


@pytest.mark.parametrize("data", INVALID.values(), ids=INVALID.keys())
def test_an_impossible_lease_counts_as_expired(loc: Location, data: bytes) -> None:
    put(loc, data)
    view = view_lease(loc)
    assert view.info is None and view.problem
    assert read_lease(loc) is None
    lease = Lease(loc, "sync", ttl=5)
    lease.acquire()  # a writer is not kept out by it
    held = read_lease(loc)
    assert held is not None and held.holder == lease.holder
    lease.release()


def test_an_invalid_lease_is_reported_once(loc: Location, caplog: pytest.LogCaptureFixture) -> None:
    put(loc, raw("NaN"))
    with caplog.at_level(logging.WARNING, logger="ferry.lease"):
        for _ in range(3):
            assert read_lease(loc) is None
    said = [r.getMessage() for r in caplog.records if r.name == "ferry.lease"]
    assert len(said) == 1 and "not valid" in said[0] and "counts as expired" in said[0]


def test_a_lease_prints_bounded_and_escaped(loc: Location) -> None:
    put(loc, body(holder="x\x1b[2J\u2028y", host="h\nforged line"))
    info = read_lease(loc)
    assert info is not None
    text = info.describe()
    assert "\x1b" not in text and "\n" not in text and "\u2028" not in text
    assert "\\x1b[2J" in text and "\\u2028" in text
    assert not re.search(r"\d{12}", text)


def test_valid_and_released_leases_still_parse(loc: Location) -> None:
    put(loc, body())
    held = read_lease(loc)
    assert held is not None and held.pid == 42 and held.ns is None  # older format: no identity
    assert held.liveness()[0] == "unknown"
    put(loc, body(expires_at=0.0))
    assert view_lease(loc).info is not None and read_lease(loc) is None


def test_a_ttl_beyond_the_maximum_is_refused(loc: Location) -> None:
    with pytest.raises(ValueError):
        Lease(loc, "sync", ttl=MAX_TTL + 1)


def _ours(**changes: Any) -> bytes:
    me = this_writer()
    return body(host=me.host, ns=me.ns, boot=me.boot, **changes)


def test_a_reused_pid_is_not_the_holder(loc: Location) -> None:
    """Same host, boot and namespace, a live pid — but a process started after the holder's."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        put(loc, _ours(pid=proc.pid, start=start + 1))
        assert read_lease(loc) is None
        put(loc, _ours(pid=proc.pid, start=start))
        held = read_lease(loc)
        assert held is not None and held.liveness()[0] == "alive"
    finally:
        proc.kill()
        proc.wait(10)
    assert read_lease(loc) is None  # killed (and reaped): gone at once, not after the ttl


def test_an_old_format_lease_of_a_gone_pid_waits_for_its_expiry(loc: Location) -> None:
    """Without namespace and boot in the lease, a pid that is gone here proves nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    put(loc, body(host=this_writer().host, pid=proc.pid))
    held = read_lease(loc)
    assert held is not None and held.liveness()[0] == "unknown"


def test_temp_names_carry_their_writer_and_older_names_still_parse() -> None:
    me = this_writer()
    name = temp_name("shards/a-b.c.arrow.zst")
    writer = temp_writer(name)
    assert writer is not None and (writer.pid, writer.start) == (me.pid, me.start) and len(writer.place) == 12
    assert len(Path(name).name) - len("a-b.c.arrow.zst") <= 60
    assert not temp_is_stale(name, 10 * STALE_TEMP_SECONDS)  # this live process' own
    old = f"shards/{TEMP_MARKER}abcd1234.999999.0123456789ab-x.arrow"
    got = temp_writer(old)
    assert got is not None and got.pid == 999999 and got.start is None
    assert not temp_is_stale(old, 60) and temp_is_stale(old, STALE_TEMP_SECONDS)  # by age only
    for bad in (f"{TEMP_MARKER}x", f"{TEMP_MARKER}..-", f"{TEMP_MARKER}zz.1.2.3-x", "plain.arrow"):
        assert temp_writer(bad) is None


def test_lease_info_check_names_the_problem() -> None:
    assert isinstance(LeaseInfo.check(body()), LeaseInfo)
    assert "not JSON" in str(LeaseInfo.check(b"{"))
    assert "expires_at" in str(LeaseInfo.check(raw("NaN")))


def test_a_lease_file_too_big_to_read_is_not_read(loc: Location) -> None:
    Path(loc.root).mkdir(parents=True)
    path = Path(loc.full(LEASE_FILE))
    with open(path, "wb") as f:
        f.truncate(17 * 1024 * 1024)  # sparse: nothing to write
    view = view_lease(loc)
    assert view.token is None and view.problem and "bytes" in view.problem
    with pytest.raises(StorageError, match="ferry lease break"):
        Lease(loc, "sync").acquire()
    assert break_lease(loc, view) is None and not path.exists()
    Lease(loc, "sync").acquire()


def test_a_broken_lease_is_reported_lost_only_with_its_reason(loc: Location, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread (the writer's loop) polls ``lost``: it must never see the lease lost before the reason
    is known (who broke it), however long the read of the lease file takes."""
    import threading

    from ferry.service.replication import lease as lease_module

    held = Lease(loc, "daemon")
    held.acquire()
    break_lease(loc, view_lease(loc))
    reading, go_on = threading.Event(), threading.Event()
    real_view = lease_module.view_lease

    def slow_view(at: Location) -> Any:
        reading.set()
        assert go_on.wait(10)
        return real_view(at)

    monkeypatch.setattr(lease_module, "view_lease", slow_view)
    renewal = threading.Thread(target=held.renew)
    renewal.start()
    assert reading.wait(10)
    seen_while_reading = held.lost
    go_on.set()
    renewal.join(10)
    assert seen_while_reading is None
    assert held.lost is not None and held.lost.startswith("the lease was broken by broken:")
    assert held.lost_to.startswith("broken:")
