"""``ferry lease show|break`` and what a writer does when its lease is broken (issue 24, item 8)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import pack, wait_until

from ferry.service.replication.engine import Engine
from ferry.service.replication.lease import LEASE_FILE, Lease, break_lease, read_lease, view_lease
from ferry.service.replication.passes import PassResult
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor, JobResult
from ferry.shard_tools.errors import LeaseHeldError, StorageError, WriteConflictError
from ferry.shard_tools.storage.store import resolve

ROOT = Path(__file__).resolve().parents[2]


def lease_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``ferry lease ARGS`` (no terminal on stdin)."""
    cmd = [sys.executable, "-m", "ferry.service.lease_cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)


HOLD = """
import sys, time
from ferry.service.replication.lease import Lease
from ferry.shard_tools.storage.store import resolve
lease = Lease(resolve(sys.argv[1]), "daemon", ttl=float(sys.argv[2]))
lease.__enter__()
print(lease.holder, flush=True)
deadline = time.monotonic() + 120
while lease.lost is None and time.monotonic() < deadline:
    time.sleep(0.05)
print("lost:", lease.lost, flush=True)
"""


@pytest.fixture
def holder(file_backend: Any) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """A live writer of this host holding ``dst``'s lease (ttl 1.5 s, renewed) until it loses it."""
    dst = file_backend.url("dst")
    proc = subprocess.Popen([sys.executable, "-c", HOLD, dst, "1.5"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        yield dst, proc.stdout.readline().strip(), proc
    finally:
        proc.kill()
        proc.wait(10)


def test_show_says_who_holds_the_lease(holder: tuple[str, str, subprocess.Popen[str]]) -> None:
    dst, holder_id, proc = holder
    run = lease_cli("show", dst)
    assert run.returncode == 0, run.stderr
    assert holder_id in run.stdout and f"pid:        {proc.pid}" in run.stdout
    assert "state:      held" in run.stdout and "alive:      yes" in run.stdout and "pid:[" in run.stdout
    run = lease_cli("show", dst, "--json")
    doc = json.loads(run.stdout)
    assert doc["state"] == "held" and doc["holder"] == holder_id and doc["pid"] == proc.pid
    assert doc["liveness"] == "alive" and 0 < doc["expires_in_s"] <= 1.5 and doc["age_s"] >= 0


def test_show_of_an_impossible_lease(file_backend: Any) -> None:
    loc = resolve(file_backend.url("dst"))
    for expiry in ("NaN", "1e308", "Infinity"):
        doc = '{"holder": "h\\u001b[2J", "kind": "daemon", "host": "x", "pid": 7, "acquired_at": 1, "expires_at": %s}'
        loc.write_bytes(LEASE_FILE, (doc % expiry).encode())
        run = lease_cli("show", loc.url)
        assert run.returncode == 0 and "invalid lease file" in run.stdout and "counts as expired" in run.stdout
        assert not re.search(r"\d{20}", run.stdout + run.stderr) and "\x1b" not in run.stdout + run.stderr
        assert json.loads(lease_cli("show", loc.url, "--json").stdout)["state"] == "invalid"


def test_show_escapes_what_the_lease_says(file_backend: Any) -> None:
    loc = resolve(file_backend.url("dst"))
    lease = Lease(loc, "daemon")
    lease.holder = "daemon:x:1:\x1b]0;pwned\x07\nforged"
    lease.acquire()
    run = lease_cli("show", loc.url)
    assert "\x1b" not in run.stdout and "\x07" not in run.stdout and "\\x1b]0;pwned" in run.stdout
    assert not any(line.startswith("forged") for line in run.stdout.splitlines())


def test_show_and_break_of_no_lease(file_backend: Any) -> None:
    run = lease_cli("show", file_backend.url("nothing"))
    assert run.returncode == 0 and "no lease" in run.stdout and "check it" in run.stdout
    run = lease_cli("break", file_backend.url("nothing"), "--yes")
    assert run.returncode == 1 and "nothing to break" in run.stderr and "Traceback" not in run.stderr


def test_usage_errors_exit_2(file_backend: Any) -> None:
    assert lease_cli("show").returncode == 2
    assert lease_cli("frob", file_backend.url("d")).returncode == 2
    run = lease_cli("show", file_backend.url("d"), "-S", "novalue")
    assert run.returncode == 2 and "key=value" in run.stderr and "Traceback" not in run.stderr


def test_break_refuses_without_yes_or_for_another_holder(holder: tuple[str, str, subprocess.Popen[str]]) -> None:
    dst, holder_id, _ = holder
    before = read_lease(resolve(dst))
    run = lease_cli("break", dst)
    assert run.returncode == 1 and "without --yes" in run.stderr
    run = lease_cli("break", dst, "--yes", "--if-holder", "daemon:other:1:deadbeef")
    assert run.returncode == 1 and "not broken" in run.stderr
    after = read_lease(resolve(dst))
    assert before is not None and after is not None and after.holder == before.holder == holder_id


def test_break_ends_a_live_holders_lease_and_it_notices(holder: tuple[str, str, subprocess.Popen[str]]) -> None:
    dst, holder_id, proc = holder
    run = lease_cli("break", dst, "--yes", "--if-holder", holder_id, "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["broken"] is True and "broke the writer lease" in run.stderr
    assert proc.stdout is not None
    assert "broken by broken:" in proc.stdout.readline()  # its next renewal found out
    assert proc.wait(10) == 0
    assert read_lease(resolve(dst)) is None
    assert json.loads(lease_cli("show", dst, "--json").stdout)["state"] == "broken"
    Lease(resolve(dst), "sync").acquire()  # free for the next writer


def test_break_never_breaks_a_lease_taken_after_it_was_shown(file_backend: Any) -> None:
    loc = resolve(file_backend.url("dst"))
    first = Lease(loc, "daemon")
    first.acquire()
    shown = view_lease(loc)
    first.release()
    second = Lease(loc, "sync")
    second.acquire()  # a new writer took it meanwhile
    with pytest.raises(WriteConflictError):
        break_lease(loc, shown)
    held = read_lease(loc)
    assert held is not None and held.holder == second.holder


def test_a_writer_whose_lease_is_broken_stops_copying_and_publishes_nothing(
    file_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = file_backend.url("src"), file_backend.url("dst")
    pack(src, 80, seed=11)
    leases: list[Lease] = []

    class Recorded(Lease):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            leases.append(self)

    original = Engine._on_result

    def on_result(self: Engine, r: JobResult, result: PassResult) -> None:
        original(self, r, result)
        if result.copied == 1:  # after the first shard: an operator breaks the lease
            loc = resolve(dst)
            break_lease(loc, view_lease(loc))
            wait_until(lambda: leases[0].lost is not None, 10, "the writer to notice at its renewal")

    monkeypatch.setattr("ferry.service.replication.engine.Lease", Recorded)
    monkeypatch.setattr(Engine, "_on_result", on_result)
    eng = Engine(Executor(transfers=1, backoff=(0.001, 0.01)), State(None), writer="sync", lease_ttl=0.3)
    locs = {"src": resolve(src), "dst": resolve(dst)}
    with pytest.raises(LeaseHeldError, match="lost the writer lease while copying"):
        eng.sync_pass("d", "src", "dst", locs)
    assert not resolve(dst).exists("manifest.json")
    shards = [p for p in resolve(dst).listdir("shards") if p.endswith(".zst")]
    assert len(shards) == 1  # no copy started after the lease was lost
    monkeypatch.setattr(Engine, "_on_result", original)
    assert eng.sync_pass("d", "src", "dst", locs).published  # the next pass takes the lease again


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_lease_path_that_is_no_file_is_not_read(file_backend: Any, kind: str) -> None:
    """A FIFO would block a reader forever, a link to /dev/zero fill its memory."""
    loc = resolve(file_backend.url("dst"))
    Path(loc.root).mkdir(parents=True)
    path = Path(loc.full(LEASE_FILE))
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    run = lease_cli("show", loc.url, "--json")
    assert run.returncode == 0 and json.loads(run.stdout)["state"] == "invalid", run.stderr
    with pytest.raises(StorageError, match="not a regular file"):
        Lease(loc, "sync").acquire()
    run = lease_cli("break", loc.url, "--yes")
    assert run.returncode == 0 and not path.is_symlink() and not path.exists(), run.stderr
    Lease(loc, "sync").acquire()


def test_show_and_break_on_s3(s3_backend: Any) -> None:
    """Storage options as the other commands take them; the break is a conditional PUT."""
    url = s3_backend.url("dst")
    endpoint = s3_backend.storage_options["client_kwargs"]["endpoint_url"]
    opts = ["-S", "key=testing", "-S", "secret=testing", "-S", f"client_kwargs.endpoint_url={endpoint}"]
    lease = Lease(resolve(url, s3_backend.storage_options), "daemon", ttl=30)
    lease.acquire()
    doc = json.loads(lease_cli("show", url, *opts, "--json").stdout)
    assert doc["state"] == "held" and doc["holder"] == lease.holder and doc["liveness"] == "alive"
    run = lease_cli("break", url, *opts, "--yes", "--if-holder", lease.holder)
    assert run.returncode == 0, run.stderr
    assert not lease.renew() and lease.lost is not None and "broken by" in lease.lost
    assert json.loads(lease_cli("show", url, *opts, "--json").stdout)["state"] == "broken"


def test_lease_errors_print_control_characters_escaped(tmp_path: Path) -> None:
    """`python -m ferry.service.lease_cli` ends its errors through the one CLI error printer: a URL holding an
    escape sequence is shown escaped, never sent to the terminal raw."""
    run = lease_cli("break", "--yes", str(tmp_path / "no\x1b[2Jdataset"))
    assert run.returncode != 0
    assert "\x1b" not in run.stderr and "\\x1b" in run.stderr, run.stderr
    assert run.stderr.startswith("ferry lease: error: ")
