"""Concurrent writers as a property, with real processes.

Each round starts four real ``ferry`` processes at once, a random mix of ``pack --append``
into a growing source S, ``ferry sync S D`` and ``ferry sync O D`` (O: a frozen copy of S's
first version, so that sync tries to move D back), and SIGKILLs some of them at random
moments. An observer in this process reads D's and S's ``manifest.json`` all the while.
The properties, at every observed moment and at the end:

- a published manifest names only shards that are stored whole (their digests are checked
  once per version, shards being immutable);
- the versions each dataset names never go backwards along the ``parent`` chain;
- every append that reported success is on the final version's history;
- ``ferry verify`` passes on S and D, and one last sync brings D to S's version.

It runs on ``file://`` (lock + rename), on S3 (moto server: conditional PUTs), on GCS
(fake-gcs-server: generation preconditions) and on Azure Blob (Azurite: ETag conditions), each
in ``test_adv_concurrent_writers.py``, and with the syncs copying as Ray tasks in ``test_ray_sync.py``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferry.shard_tools.format.header import parse_header
from ferry.shard_tools.storage.conditional import read_versioned
from ferry.shard_tools.storage.publish import descends_from
from ferry.shard_tools.storage.store import Location, resolve

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("FERRY_WRITER_ROUNDS", "50"))  # a developer may run fewer
CLOUD_ROUNDS = min(ROUNDS, 8)  # on the GCS and Azure emulators: a round there is many times slower
S3_ROUNDS = min(ROUNDS, 16)  # on moto a round takes ~3x a file round: `make soak` runs all ROUNDS there
PROCESSES = 4
KILL_SHARE = 0.3  # of the processes, SIGKILLed at a random moment of their run
ROUND_TIMEOUT = 90.0
_CLI = "import sys; from ferry.shard_tools.cli import main; sys.exit(main())"


@dataclass
class Observed:
    """Distinct versions a dataset's manifest.json named, in the order they were seen."""

    versions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _write_inputs(directory: Path, n: int, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        p = directory / f"in-{seed}-{i}.jsonl"
        rows = [{"tokens": rng.integers(1, 4000, size=int(rng.integers(50, 400))).tolist()} for _ in range(30)]
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(p)
    return paths


def _ferry(args: list[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env}, cwd=ROOT, start_new_session=True,
    )  # fmt: skip


def _shards_stored(loc: Location, header: dict[str, Any]) -> str | None:
    """None if every shard the version names is stored at its recorded size, else why not."""
    from ferry.shard_tools.format.manifest import Manifest

    table = loc.read_bytes(header["shard_table"]["path"])
    manifest = Manifest.from_json(json.dumps(header).encode(), table)
    loc.fs.invalidate_cache(loc.root)
    found = loc.fs.find(loc.full("shards"), detail=True)
    sizes = {str(k).rsplit("/", 1)[-1]: int(v.get("size") or 0) for k, v in found.items()}
    for info in manifest.shards:
        if sizes.get(info.path.rsplit("/", 1)[-1]) != info.stored_bytes:
            return f"{manifest.version_id} names {info.path}, which is not stored whole"
    return None


def _observe(loc: Location, seen: Observed, stop: threading.Event) -> None:
    while not stop.wait(0.02):
        try:
            got = read_versioned(loc, "manifest.json")
        except Exception as exc:  # noqa: BLE001 - a read failure is a finding, not a crash of the observer
            seen.problems.append(f"cannot read {loc.url}/manifest.json: {exc}")
            continue
        if got.data is None:
            continue
        try:
            header = parse_header(got.data)
        except Exception as exc:  # noqa: BLE001
            seen.problems.append(f"{loc.url}/manifest.json unreadable: {exc}")
            continue
        version = str(header["version_id"])
        if seen.versions and seen.versions[-1] == version:
            continue
        seen.versions.append(version)
        why = _shards_stored(loc, header)
        if why is not None:
            seen.problems.append(why)


def _monotone(seen: Observed, chain_at: list[Location]) -> list[str]:
    out = []
    for older, newer in zip(seen.versions, seen.versions[1:], strict=False):
        ok, why = descends_from(chain_at, newer, older)
        if not ok:
            out.append(f"moved back from {older} to {newer}: {why}")
    return out


def _history(loc: Location, chain_at: Location) -> set[str]:
    """Every version on the parent chain of ``loc``'s current one (read at ``chain_at``)."""
    out: set[str] = set()
    v: str | None = str(parse_header(loc.read_bytes("manifest.json"))["version_id"])
    while v is not None and v not in out:
        out.add(v)
        parent = parse_header(chain_at.read_bytes(f"versions/{v}.json")).get("parent")
        v = None if parent is None else str(parent)
    return out


def _run_round(
    rng: random.Random, urls: Mapping[str, str], inputs: list[Path], env: Mapping[str, str], sync_args: Sequence[str]
) -> list[Any]:
    """Start PROCESSES writers at once, kill some; returns (kind, returncode, stdout, stderr, killed)."""
    jobs: list[tuple[str, list[str]]] = []
    for _ in range(PROCESSES):
        kind = rng.choice(["append", "append", "sync", "sync-old"])
        if kind == "append":
            jobs.append((kind, ["pack", str(inputs.pop()), "--out", urls["S"], "--append", "--vocab-size", "4096",
                                "--eos-id", "0", "--shard-size", "4096", "--json"]))  # fmt: skip
        else:
            source = urls["S"] if kind == "sync" else urls["O"]
            jobs.append((kind, ["sync", source, urls["D"], "--json", "--transfers", "2", "--retries", "2", *sync_args]))
    procs = [_ferry(args, env) for _, args in jobs]
    kill = {i: rng.uniform(0.05, 1.2) for i in range(len(procs)) if rng.random() < KILL_SHARE}
    started = time.monotonic()
    killed: set[int] = set()
    while any(p.poll() is None for p in procs) and time.monotonic() - started < ROUND_TIMEOUT:
        for i, at in kill.items():
            if i not in killed and time.monotonic() - started >= at and procs[i].poll() is None:
                procs[i].send_signal(signal.SIGKILL)
                killed.add(i)
        time.sleep(0.01)
    out = []
    for i, ((kind, _), p) in enumerate(zip(jobs, procs, strict=True)):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
            pytest.fail(f"a {kind} process ran past {ROUND_TIMEOUT} s")
        stdout, stderr = p.communicate(timeout=30)
        out.append((kind, p.returncode, stdout, stderr, i in killed))
    return out


def _check_outcome(kind: str, code: int, stdout: str, stderr: str, killed: bool) -> str | None:
    """The published version of a successful append; fails on any outcome a user must not see."""
    if killed and code == -signal.SIGKILL:
        return None
    assert "Traceback" not in stderr, stderr
    if code == 0:
        return str(json.loads(stdout)["version_id"]) if kind == "append" else None
    assert code == 1, f"{kind} exited {code}: {stderr}"
    allowed = ("refusing to publish", "is being written by", "could not be copied", "kept changing", "NOT published")
    assert any(a in stderr + stdout for a in allowed), f"{kind} failed unexpectedly: {stderr}"
    return None


def concurrent_writers(
    base: str,
    options: Mapping[str, Any],
    env: Mapping[str, str],
    tmp_path: Path,
    rounds: int = ROUNDS,
    sync_args: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The property on the store at ``base``; ``sync_args`` are added to every racing ``ferry sync``.
    Returns the JSON reports of the racing syncs that succeeded."""
    rng = random.Random(20261201)
    urls = {k: f"{base}/{k.lower()}" for k in ("S", "O", "D")}
    inputs = _write_inputs(tmp_path, rounds * PROCESSES + 1, 1)
    first = _ferry(["pack", str(inputs.pop()), "--out", urls["S"], "--vocab-size", "4096", "--eos-id", "0",
                    "--shard-size", "4096"], env)  # fmt: skip
    assert first.wait(60) == 0, first.communicate()[1]
    frozen = _ferry(["sync", urls["S"], urls["O"]], env)
    assert frozen.wait(60) == 0, frozen.communicate()[1]
    locs = {k: resolve(u, options) for k, u in urls.items()}
    seen = {k: Observed() for k in ("S", "D")}
    stop = threading.Event()
    observers = [threading.Thread(target=_observe, args=(locs[k], seen[k], stop), daemon=True) for k in seen]
    for t in observers:
        t.start()
    appended: list[str] = []
    synced: list[dict[str, Any]] = []
    outcomes: dict[tuple[str, bool], int] = {}
    try:
        for _ in range(rounds):
            for kind, code, stdout, stderr, killed in _run_round(rng, urls, inputs, env, sync_args):
                outcomes[(kind, code == 0)] = outcomes.get((kind, code == 0), 0) + 1
                if kind != "append" and code == 0:
                    synced.append(json.loads(stdout))
                version = _check_outcome(kind, code, stdout, stderr, killed)
                if version is not None:
                    appended.append(version)
    finally:
        stop.set()
        for t in observers:
            t.join(10)
    last = _ferry(["sync", urls["S"], urls["D"], "--json"], env)
    assert last.wait(120) == 0, last.communicate()[1]
    for k in ("S", "D"):
        assert seen[k].problems == []
        assert _monotone(seen[k], [locs["S"], locs["D"], locs["O"]]) == []
    history = _history(locs["S"], locs["S"])
    assert [v for v in appended if v not in history] == []  # no successful append lost
    assert _history(locs["D"], locs["S"]) == history
    for k in ("S", "D"):
        verify = _ferry(["verify", urls[k]], env)
        assert verify.wait(120) == 0, verify.communicate()
    # the mix really raced: appends and syncs both succeeded, and D was seen at several versions
    assert outcomes.get(("append", True), 0) >= rounds // 2 and outcomes.get(("sync", True), 0) >= max(1, rounds // 10)
    assert len(seen["D"].versions) >= 3 and len(appended) == len(set(appended))
    return synced
