"""A killed or interrupted `ferry pack --workers 2` leaves no process behind (real processes, Linux /proc).

Each test starts the pack in its own session, records every descendant (the resource tracker,
the fork server, the workers) through the ppid links in /proc/*/stat while the pack lives,
acts on it, and asserts every recorded process is gone within a bounded time. Whatever
survives is SIGKILLed in a finally, so a failing test leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import wait_until

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
# ferry with plain spawn-started workers, as on platforms without a fork server
FERRY_SPAWN = [
    sys.executable,
    "-c",
    "import multiprocessing, sys; import ferry.shard_tools.packer.executors as ex; "
    "from ferry.shard_tools.cli import main; "
    "ex.worker_context = lambda: multiprocessing.get_context('spawn'); sys.exit(main())",
]
# zstd level 19 on 2,000 random ids per document: a few seconds of work per worker.
PACK_ARGS = ["--vocab-size", "50257", "--eos-id", "50256", "--shard-size", "64KiB", "--compression", "zstd:19"]
GONE_WITHIN = 10.0  # seconds for every recorded descendant to end
START_WITHIN = 60.0  # seconds for the workers to appear on a loaded machine

Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid reused by another process is not ours


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of ``pid``, or None when it no longer exists."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> set[Proc]:
    """Every live process below ``root``, found through the ppid links in /proc."""
    children: dict[int, list[Proc]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[1], []).append((int(entry), st[2]))
    found: set[Proc] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return found


def alive(proc: Proc) -> bool:
    st = _stat(proc[0])
    return st is not None and st[2] == proc[1] and st[0] != "Z"  # a zombie has ended; only its entry waits


def survivors(procs: set[Proc], within: float) -> set[Proc]:
    """The processes of ``procs`` still running after ``within`` seconds (polled, returns early)."""
    deadline = time.monotonic() + within
    left = {p for p in procs if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    return left


def corpus(tmp_path: Path, files: int = 6, docs: int = 1500, bad_file: bool = False) -> list[str]:
    """``files`` Parquet files of ``docs`` documents of 1–1,999 random token ids."""
    rng = np.random.default_rng(13)
    paths = []
    for f in range(files):
        lists = [rng.integers(0, 50_000, size=int(rng.integers(1, 2000))).tolist() for _ in range(docs)]
        if bad_file and f == files - 1:
            lists[-1][-1] = 60_000  # outside --vocab-size 50257: the worker packing this file fails
        path = tmp_path / "in" / f"part-{f}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path)
        paths.append(str(path))
    return paths


@contextmanager
def pack_with_workers(
    tmp_path: Path, inputs: list[str], ferry: list[str] = FERRY
) -> Iterator[tuple[subprocess.Popen[str], set[Proc]]]:
    """Start `ferry pack --workers 2` in its own session; yield it once its two workers run,
    with the set of its descendants (kept up to date by :func:`record`)."""
    cmd = [*ferry, "pack", *inputs, "--out", str(tmp_path / "out"), *PACK_ARGS, "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: set[Proc] = set()
    try:

        def started() -> bool:
            seen.update(descendants(proc.pid))
            return _workers_started(proc.pid, seen, forkserver=ferry is FERRY)

        wait_until(started, START_WITHIN, "the two pack workers", proc=proc, interval=0.02)
        yield proc, seen
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the fork server and workers share its process group
        for p in seen:
            if alive(p):
                with suppress(ProcessLookupError):
                    os.kill(p[0], signal.SIGKILL)
        proc.communicate(timeout=30)


def _workers_started(root: int, seen: set[Proc], forkserver: bool) -> bool:
    """The resource tracker and the fork server are children of ferry, fork server workers its
    grandchildren; spawned workers are children."""
    if not forkserver:
        return len(seen) >= 3
    grandchildren = [p for p in seen if (st := _stat(p[0])) is not None and st[1] != root]
    return len(seen) >= 4 and len(grandchildren) >= 2


def record(proc: subprocess.Popen[str], seen: set[Proc]) -> None:
    """Add the descendants of ``proc`` now; call while it still lives."""
    seen |= descendants(proc.pid)


@pytest.mark.parametrize(
    ("sig", "ferry"),
    [(signal.SIGKILL, FERRY), (signal.SIGTERM, FERRY), (signal.SIGKILL, FERRY_SPAWN)],
    ids=["sigkill", "sigterm", "sigkill-spawn"],
)
def test_killed_pack_leaves_no_process(tmp_path: Path, sig: signal.Signals, ferry: list[str]) -> None:
    """SIGTERM too: Python's default action ends the process without running any cleanup."""
    with pack_with_workers(tmp_path, corpus(tmp_path), ferry) as (proc, seen):
        record(proc, seen)
        assert proc.poll() is None, "pack finished before the kill: the corpus is too small to test anything"
        os.kill(proc.pid, sig)  # only the main process: its helpers get no signal
        proc.wait(timeout=30)
        assert proc.returncode == -sig
        left = survivors(seen, GONE_WITHIN)
        assert not left, f"still running {GONE_WITHIN}s after ferry got {sig.name}: {left}"
    assert not (tmp_path / "out" / "manifest.json").exists()  # nothing was published


def wait_for_shards(proc: subprocess.Popen[str], out: Path, count: int = 1) -> None:
    """Until ``count`` shards are stored: the workers are past their start-up and packing."""
    shards = out / "shards"

    def stored() -> bool:
        return shards.is_dir() and len(list(shards.iterdir())) >= count

    wait_until(stored, START_WITHIN, f"{count} stored shard(s) (if pack exited first, the corpus is too small)",
               proc=proc, interval=0.02)  # fmt: skip


@pytest.mark.parametrize(
    ("group", "when"),
    [(True, "start"), (True, "packing"), (True, "idle"), (False, "packing")],
    ids=["ctrl-c-at-start", "ctrl-c", "ctrl-c-idle-worker", "kill-int"],
)
def test_sigint_exits_cleanly(tmp_path: Path, group: bool, when: str) -> None:
    """Ctrl-C reaches the whole process group; `kill -INT` only ferry itself. "start": as soon as
    the workers exist; "idle": with a one-document first file, one worker is done and waits on
    its queue while the other packs the big file."""
    inputs = corpus(tmp_path, files=6 if when == "start" else 2)  # at start: units queued behind the workers
    if when == "idle":
        inputs = [*corpus(tmp_path / "tiny", files=1, docs=1), inputs[0]]
    with pack_with_workers(tmp_path, inputs) as (proc, seen):
        record(proc, seen)
        if when != "start":
            wait_for_shards(proc, tmp_path / "out", count=2 if when == "idle" else 1)
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert err == "ferry pack: interrupted\n", err  # one line: no traceback from a worker or the pool
        assert not survivors(seen, GONE_WITHIN)


def test_worker_error_exits_cleanly(tmp_path: Path) -> None:
    with pack_with_workers(tmp_path, corpus(tmp_path, bad_file=True)) as (proc, seen):
        record(proc, seen)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err
        assert "outside the vocabulary" in err and err.count("\n") == 1, err
        assert not survivors(seen, GONE_WITHIN)


def test_normal_pack_leaves_no_process(tmp_path: Path) -> None:
    with pack_with_workers(tmp_path, corpus(tmp_path)) as (proc, seen):
        record(proc, seen)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert not survivors(seen, GONE_WITHIN)


# ferry whose second pool worker gets a Ctrl-C the moment the fork server has forked it, before the pool
# registers it: the window a Ctrl-C "at start" can hit on a loaded machine
FERRY_SIGINT_IN_SPAWN = [
    sys.executable,
    "-c",
    "import os, signal, sys, concurrent.futures.process as cfp, multiprocessing.process as mpp\n"
    "real, started = mpp.BaseProcess.start, []\n"
    "def start(self):\n"
    "    worker = getattr(self, '_target', None) is cfp._process_worker  # start() drops _target\n"
    "    real(self)\n"
    "    if worker:\n"
    "        started.append(self)\n"
    "        if len(started) == 2:\n"
    "            os.kill(os.getpid(), signal.SIGINT)\n"
    "mpp.BaseProcess.start = start\n"
    "from ferry.shard_tools.cli import main\n"
    "sys.exit(main())",
]


def test_sigint_while_the_pool_starts_a_worker_exits_cleanly(tmp_path: Path) -> None:
    """The interrupt must not leave a worker the pool never registered: ferry ends, as with any other Ctrl-C."""
    cmd = [*FERRY_SIGINT_IN_SPAWN, "pack", *corpus(tmp_path), "--out", str(tmp_path / "out"), *PACK_ARGS,
           "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: set[Proc] = set()
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            seen |= descendants(proc.pid)
            time.sleep(0.02)
        assert proc.poll() is not None, "ferry pack did not exit within 60 s of a Ctrl-C while starting its workers"
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert err == "ferry pack: interrupted\n", err
        assert not survivors(seen, GONE_WITHIN)
        assert not (tmp_path / "out" / "manifest.json").exists()
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for p in seen:
            if alive(p):
                with suppress(ProcessLookupError):
                    os.kill(p[0], signal.SIGKILL)
        proc.communicate(timeout=30)
