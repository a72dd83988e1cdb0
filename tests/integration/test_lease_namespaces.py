"""Writers that share a host name but not a PID namespace (containers with host networking).

A holder in another PID namespace has a pid that means nothing here: it must count as alive until
its lease expires, and its temp files as live until stale by age (issue 24, item 2). The holders run
in real PID namespaces (``unshare -pf --mount-proc``, root only), with a pid chosen so that no
process of this namespace has it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import pack, wait_until

from ferry.service.replication.lease import Lease, read_lease
from ferry.shard_tools.errors import LeaseHeldError
from ferry.shard_tools.storage.store import STALE_TEMP_SECONDS, resolve

ROOT = Path(__file__).resolve().parents[2]


def _unshare_works() -> str | None:
    """Why real PID namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "PID namespaces need root (unshare -p)"
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    try:
        run = subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if run.returncode == 0 else f"unshare -pf --mount-proc fails here: {run.stderr.decode()[-200:]}"


_WHY_NOT = _unshare_works()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def _free_pid() -> int:
    """A pid no process of this namespace has (nor its neighbour), below pid_max."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(pid_max - 50, 300, -97):
        if not any(Path(f"/proc/{p}").exists() for p in (pid - 1, pid, pid + 1)):
            return pid
    raise AssertionError("no free pid")


def in_pidns(code: str, *args: str, pid: int) -> subprocess.Popen[str]:
    """``python -c code args`` as process ``pid`` of a new PID namespace (killed with the namespace)."""
    shell = f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "$0" "$@"; exit $?'  # forks python: pid ns_last_pid+1
    cmd = ["unshare", "-pf", "--kill-child", "--mount-proc", "sh", "-c", shell, sys.executable, "-c", code, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the namespace's processes (their group) and reap ``unshare``."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


HOLD = """
import os, sys, time
from ferry.service.replication.lease import Lease
from ferry.shard_tools.storage.store import resolve, temp_name
loc = resolve(sys.argv[1])
if sys.argv[2] != "-":
    Lease(loc, "daemon", ttl=float(sys.argv[2])).__enter__()  # taken and renewed until killed
tmp = loc.full(temp_name("shards/being-written.arrow.zst"))
os.makedirs(os.path.dirname(tmp), exist_ok=True)
with open(tmp, "wb") as f:
    f.write(b"half")
print(os.getpid(), tmp, flush=True)
time.sleep(300)
"""

TRY = """
import sys
from ferry.service.replication.lease import Lease
from ferry.shard_tools.errors import LeaseHeldError
from ferry.shard_tools.storage.store import resolve
try:
    Lease(resolve(sys.argv[1]), "sync").acquire()
except LeaseHeldError as exc:
    print("held", exc)
else:
    print("taken")
"""


@pytest.fixture
def holder(file_backend: Any) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """A writer in its own PID namespace holding ``dst``'s lease (ttl 3 s) and filling a temp file there."""
    dst, pid = file_backend.url("dst"), _free_pid()
    proc = in_pidns(HOLD, dst, "3", pid=pid)
    try:
        assert proc.stdout is not None
        got_pid, tmp = proc.stdout.readline().split()
        assert int(got_pid) == pid and not Path(f"/proc/{pid}").exists()  # a pid that is nobody here
        yield dst, tmp, proc
    finally:
        kill(proc)


def ferry(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "import sys; from ferry.shard_tools.cli import main; sys.exit(main())", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_holder_in_another_pid_namespace_keeps_its_lease_until_it_expires(
    file_backend: Any, holder: tuple[str, str, subprocess.Popen[str]]
) -> None:
    dst, tmp, proc = holder
    loc = resolve(dst)
    with pytest.raises(LeaseHeldError):  # this namespace
        Lease(loc, "sync").acquire()
    first = read_lease(loc)
    assert first is not None and first.liveness()[0] == "unknown" and "PID namespace" in first.liveness()[1]
    other = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-c", TRY, dst],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert other.stdout.startswith("held"), other.stdout + other.stderr  # a third namespace
    src = file_backend.url("src")
    pack(src, 40, seed=3)
    run = ferry("sync", src, dst)
    assert run.returncode == 1 and "is being written by daemon" in run.stderr, run.stderr
    assert Path(tmp).read_bytes() == b"half"  # the live writer's temp file is still there
    # the holder renews: still held after its first expiry has passed
    wait_until(lambda: time.time() > first.expires_at + 0.5, 10, "the first expiry to pass", interval=0.1)
    with pytest.raises(LeaseHeldError):
        Lease(loc, "sync").acquire()
    kill(proc)  # the holder really dies: its lease ends when it expires, not before
    last = read_lease(loc)
    assert last is not None and last.holder == first.holder

    def take() -> bool:
        try:
            Lease(loc, "sync").acquire()
        except LeaseHeldError:
            assert time.time() < last.expires_at + 1.0  # refused only while the dead holder's lease ran
            return False
        return True

    wait_until(take, 20, "the dead holder's lease to expire", interval=0.1)
    assert time.time() >= last.expires_at


def test_temp_file_of_a_writer_in_another_pid_namespace_is_not_deleted(file_backend: Any) -> None:
    src, dst = file_backend.url("src"), file_backend.url("dst")
    pack(src, 40, seed=4)
    assert ferry("sync", src, dst).returncode == 0
    proc = in_pidns(HOLD, dst, "-", pid=_free_pid())  # a live writer (no lease: e.g. a pack --append)
    try:
        assert proc.stdout is not None
        tmp = Path(proc.stdout.readline().split()[1])
        pack(src, 10, seed=5, append=True)
        run = ferry("sync", src, dst, "--json")
        assert run.returncode == 0, run.stderr
        assert tmp.read_bytes() == b"half" and '"temps_deleted": 0' in run.stdout
    finally:
        kill(proc)
    pack(src, 10, seed=6, append=True)  # dead now, but this namespace cannot tell: stale only by age
    assert ferry("sync", src, dst).returncode == 0 and tmp.exists()
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(tmp, (old, old))
    pack(src, 10, seed=7, append=True)
    assert ferry("sync", src, dst).returncode == 0 and not tmp.exists()


def test_temp_file_of_a_killed_writer_in_this_namespace_is_deleted_at_once(file_backend: Any) -> None:
    src, dst = file_backend.url("src"), file_backend.url("dst")
    pack(src, 40, seed=8)
    assert ferry("sync", src, dst).returncode == 0
    proc = subprocess.Popen([sys.executable, "-c", HOLD, dst, "-"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        tmp = Path(proc.stdout.readline().split()[1])
    finally:
        proc.kill()
        proc.wait(10)
    pack(src, 10, seed=9, append=True)
    run = ferry("sync", src, dst, "--json")
    assert run.returncode == 0 and not tmp.exists() and '"temps_deleted": 1' in run.stdout, run.stdout


SAME_NS = """
import subprocess, sys, time
from ferry.service.replication.lease import Lease
from ferry.shard_tools.errors import LeaseHeldError
from ferry.shard_tools.storage.store import resolve
loc = resolve(sys.argv[1])
code = "import sys, time; from ferry.service.replication.lease import Lease; " \\
       "from ferry.shard_tools.storage.store import resolve; " \\
       "Lease(resolve(sys.argv[1]), 'daemon', ttl=600).acquire(); print('held', flush=True); time.sleep(300)"
holder = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "held"
try:
    Lease(loc, "sync").acquire()
except LeaseHeldError:
    print("refused while alive")
holder.kill()
holder.wait()
Lease(loc, "sync").acquire()  # the holder of this namespace is gone: at once, not after 600 s
print("taken at once")
"""


def test_in_one_container_a_killed_holder_is_seen_gone_at_once(file_backend: Any) -> None:
    """Writers sharing a PID namespace (other than the host's) still see each other die."""
    run = subprocess.run(["unshare", "-pf", "--mount-proc", sys.executable, "-c", SAME_NS, file_backend.url("d")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert run.stdout.split("\n")[:2] == ["refused while alive", "taken at once"], run.stdout + run.stderr


def test_a_writer_whose_proc_is_another_namespaces_claims_no_identity(file_backend: Any) -> None:
    """``unshare -p`` without a new /proc: /proc shows the parent namespace, where this process' pid
    means another process. Its lease records no namespace (so nobody judges it by pid)."""
    dst = file_backend.url("d")
    code = "import sys; from ferry.service.replication.lease import Lease; " \
           "from ferry.shard_tools.storage.store import resolve; " \
           "Lease(resolve(sys.argv[1]), 'daemon', ttl=600).acquire()"  # fmt: skip
    run = subprocess.run(["unshare", "-pf", sys.executable, "-c", code, dst], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)  # fmt: skip
    assert run.returncode == 0, run.stderr
    held = read_lease(resolve(dst))  # its process has exited, but nothing here can tell
    assert held is not None and held.ns is None and held.start is None and held.liveness()[0] == "unknown"
