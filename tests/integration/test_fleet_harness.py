"""The fleet chaos harness (``tests/fleet.py``) itself: its schedule is a function of the seed, and
its invariants and process tracking find what they are meant to find."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fleet import (
    BOUNDED,
    ROLES,
    Job,
    Ledger,
    Procs,
    inv_loader_streams,
    inv_no_rollback,
    make_schedule,
    wait_for,
)
from helpers import pack

from ferry.shard_tools.storage.store import resolve


def test_schedule_is_a_function_of_the_seed_and_covers_every_fault_on_every_role() -> None:
    one = make_schedule(7, BOUNDED, True)
    assert one == make_schedule(7, BOUNDED, True)
    assert one != make_schedule(8, BOUNDED, True)
    faults = {(e.kind, e.role) for e in one if e.kind.startswith("sig")}
    assert faults == {(k, r) for k in ("sigkill", "sigterm", "sigstop") for r in ROLES}
    assert [e.kind for e in one].count("flood") == 1
    assert [e.kind for e in one].count("pack") == BOUNDED.packers
    assert all(0 <= e.at <= BOUNDED.churn_s for e in one)
    # without namespaces the same seed draws the same schedule, minus the namespaces
    plain = make_schedule(7, BOUNDED, False)
    assert [(e.at, e.kind, e.role) for e in plain] == [(e.at, e.kind, e.role) for e in one]
    assert not any(e.opt("namespace") for e in plain)


def test_off_leaves_kinds_out_and_refuses_unknown_ones() -> None:
    events = make_schedule(7, BOUNDED, True, frozenset({"flood", "sigstop", "repack", "namespace"}))
    assert not any(e.kind in ("flood", "sigstop") for e in events)
    assert not any(e.opt("repack") or e.opt("namespace") for e in events)
    with pytest.raises(ValueError, match="unknown kinds.*'sigint'"):
        make_schedule(7, BOUNDED, True, frozenset({"sigint"}))


def _job(tmp_path: Path, name: str, lines: list[str], code: int, signals: list[str]) -> Job:
    proc = subprocess.Popen(["sh", "-c", f"exit {code}"])
    proc.wait(10)
    out = tmp_path / f"{name}.txt"
    out.write_text("".join(f"{line}\n" for line in lines))
    return Job("loader", name, proc, out, tmp_path / f"{name}.err", 0.0, signals=signals, meta={"version": "v"})


def test_loader_streams_must_match_the_reference_or_be_a_prefix_of_it(tmp_path: Path) -> None:
    ref = ["a", "b", "c"]
    good = [
        _job(tmp_path, "whole", [*ref, "END"], 0, []),
        _job(tmp_path, "killed", ["a", "b"], 1, ["SIGKILL"]),
    ]
    assert inv_loader_streams(good, ref) == []
    [diverged] = inv_loader_streams([*good, _job(tmp_path, "bad", ["a", "x"], 1, ["SIGTERM"])], ref)
    assert "batch 1 differs" in diverged
    [short] = inv_loader_streams([*good, _job(tmp_path, "short", ["a", "END"], 0, [])], ref)
    assert "after 1 of 3 batches" in short
    [failed] = inv_loader_streams([*good, _job(tmp_path, "failed", ["a"], 1, [])], ref)
    assert "failed on its own" in failed
    assert inv_loader_streams([_job(tmp_path, "k2", ["a"], 1, ["SIGKILL"])], ref) == [
        "none of the 1 loaders finished its epoch"
    ]


def test_a_move_back_along_the_parent_chain_is_a_rollback(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    first = pack(url, 20).version_id
    second = pack(url, 20, seed=1, append=True).version_id
    chain = [resolve(url)]
    assert inv_no_rollback({"d": [first, second]}, chain) == []
    [back] = inv_no_rollback({"d": [first, second, first]}, chain)
    assert back.startswith(f"d moved from {second} to {first}")


def test_the_ledger_sees_a_published_object_rewritten_in_place(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    pack(url, 20)
    loc = resolve(url)
    ledger = Ledger()
    ledger.scan("d", loc)
    ledger.scan("d", loc, recheck=True)
    assert ledger.changes == [] and len(ledger.seen) > 2
    shard = next(p for _, p in ledger.seen if p.startswith("shards/"))
    data = bytearray((tmp_path / "ds" / shard).read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    (tmp_path / "ds" / shard).write_bytes(bytes(data))
    ledger.scan("d", loc)
    assert ledger.changes == []  # the cheap scan compares sizes only
    ledger.scan("d", loc, recheck=True)
    [change] = ledger.changes
    assert change.startswith(f"d/{shard}:")


def test_procs_finds_an_orphan_left_in_a_session_and_kills_it(tmp_path: Path) -> None:
    procs = Procs(tmp_path, {"PATH": "/usr/bin:/bin"})
    job = procs.spawn("pack", "orphaning", ["sh", "-c", "sleep 60 & echo $! ; exit 0"])
    assert job.proc.wait(10) == 0
    orphan = int(wait_for(lambda: job.out.read_text().strip(), 10.0))
    try:
        # the shell forks the orphan, then the orphan execs sleep: until then its command line is the shell's
        assert wait_for(lambda: any(p.startswith(f"pid {orphan} (sleep 60") for p in procs.lingering()), 10.0, 0.05)
        [left] = procs.lingering()
        assert left.startswith(f"pid {orphan} (sleep 60") and "orphaning" in left
    finally:
        procs.kill_all()
    assert wait_for(lambda: procs.lingering() == [], 10.0, 0.05)
