"""A fleet of ferry processes under a seeded fault schedule: the harness of
``tests/integration/test_fleet_chaos.py``.

The fleet: three clusters in a chain, origin (a local directory) → hub (S3 on the moto server)
→ far (a local directory), or with ``Topology.swarm`` origin → hub and far filling as a swarm
(``[swarm] enabled``: far pulls shards from the hub while both fill a version, and the other way
round), one ``ferry serve`` per cluster (``cluster = NAME``; retention
``keep_versions`` at the hub), a ``ferry sync HUB /nvme`` follower started again whenever none
runs (the README's ``s3://… → /nvme`` pattern), ``ferry pack --append`` packers at the origin
(some with other compression or frame size, some re-packing an input already packed, some in
their own PID namespace), and loaders (``TokenLoader`` with a DataLoader worker over the
replicas far, hub, origin, nearest first, pinned to the first version; one that ends is
followed by a new one while the faults last).

Faults come from a schedule drawn from one seed (:func:`make_schedule`; printed with every
report): SIGKILL, SIGTERM, SIGSTOP for longer than the lease ttl then SIGCONT, of daemons,
syncs, packers and loaders; a flood of slow clients (one header byte per socket per second)
against the hub daemon's API, which runs, like every daemon here, with a soft limit of
``Sizes.daemon_nofile`` open files, so a flood of a few hundred sockets reaches it. Which live
process a fault hits is drawn at run time from a second generator of the same seed.

Each invariant is a small function returning its findings (``inv_*``); :func:`run_fleet` runs
the fleet, lets it converge once the faults stop, and returns every finding by invariant.

Run as a script this module is the entry point of the fleet's child processes:

    python tests/fleet.py ferry ARGS...   ferry ARGS, with a lease ttl of $FLEET_LEASE_TTL s and a soft
                                          limit of $FLEET_NOFILE open files, where set
    python tests/fleet.py load OUT ...    read a pinned version; one digest line per batch, then END
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from configs import Api, Cluster, FerryToml, Limits, Link, Rule, Swarm, Transfer

ROOT = Path(__file__).resolve().parents[1]
DATASET = "corpus"
VOCAB, EOS = 4096, 0
SEQ_LEN, BATCH = 128, 4
CLUSTERS = ("origin", "hub", "far")
DESTINATIONS = ("origin", "hub", "far", "nvme")  # every place a version is published
ROLES = ("daemon", "sync", "pack", "loader")
OFF_KINDS = frozenset({"repack", "namespace", "flood", "sigkill", "sigterm", "sigstop", "retention"})
TERM_GRACE_S = 20.0  # a SIGTERMed process must be gone by then
EXIT_GRACE_S = 2.0  # a process that ends by itself or on SIGTERM has stopped its children by then
LINGER_GRACE_S = 12.0  # DataLoader workers notice a dead parent within 5 s
# Reasons a process of the fleet may exit 1 on its own, by role (anything else is a finding).
ALLOWED_FAILURES = {
    "sync": ("is being written by", "kept changing"),
    "pack": ("kept changing", "is being written by"),
}


@dataclass(frozen=True)
class Sizes:
    """How big a run is; the bounded test and the slow one differ only in these."""

    churn_s: float = 22.0
    initial_inputs: int = 6
    packers: int = 6
    loaders: int = 2
    faults: int = 12
    flood_sockets: int = 300
    flood_s: float = 8.0
    lease_ttl: float | None = 3.0  # None: ferry's own ttl
    converge_s: float = 45.0
    docs_per_input: int = 30
    daemon_nofile: int = 256
    keep_versions: int = 1
    loader_delay_s: float = 0.15  # a training step: an epoch outlasts several sync passes and faults


BOUNDED = Sizes()
SLOW = Sizes(churn_s=150.0, initial_inputs=10, packers=30, loaders=5, faults=45, flood_sockets=600, flood_s=30.0,
             lease_ttl=None, converge_s=120.0, keep_versions=2)  # fmt: skip


# ---------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Event:
    """One scheduled action, ``at`` seconds into the churn."""

    at: float
    kind: str  # pack | sigkill | sigterm | sigstop | flood
    role: str = ""  # the role a fault hits
    opts: tuple[tuple[str, Any], ...] = ()

    def opt(self, key: str, default: Any = None) -> Any:
        return dict(self.opts).get(key, default)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.opts)
        return f"t={self.at:6.2f}s {self.kind:8} {self.role:7} {extra}".rstrip()


def make_schedule(seed: int, sizes: Sizes, namespaces: bool, off: frozenset[str] = frozenset()) -> list[Event]:
    """Every action of a run, from ``seed`` alone; ``off`` leaves out kinds of actions (``repack``,
    ``namespace``, ``flood``, ``sigkill``, ``sigterm``, ``sigstop``; ``retention``: the hub keeps every
    version) to tell which one a finding needs."""
    if off - OFF_KINDS:
        raise ValueError(
            f"unknown kinds of actions to leave out: {sorted(off - OFF_KINDS)}; known: {sorted(OFF_KINDS)}"
        )
    rng = random.Random(seed)
    end = sizes.churn_s
    events: list[Event] = []
    for _ in range(sizes.packers):
        opts = (("compression", rng.choice(["zstd:1", "zstd:1", "zstd:3"])),
                ("frame_size", rng.choice(["", "", "4KiB"])),
                ("namespace", rng.random() < 0.35 and namespaces and "namespace" not in off),
                ("repack", rng.random() < 0.25 and "repack" not in off))  # fmt: skip
        events.append(Event(rng.uniform(0.5, end * 0.8), "pack", opts=opts))
    kinds = ("sigkill", "sigterm", "sigstop")
    cover = [(k, r) for k in kinds for r in ROLES]  # each fault on each role once, then at random
    rng.shuffle(cover)
    for i in range(sizes.faults):
        kind, role = cover[i] if i < len(cover) else (rng.choice(kinds), rng.choice(ROLES))
        events.append(Event(rng.uniform(1.0, end * 0.9), kind, role))
    events.append(Event(rng.uniform(end * 0.2, end * 0.4), "flood", "daemon", (("target", "hub"),)))
    return sorted((e for e in events if e.kind not in off), key=lambda e: e.at)


# ---------------------------------------------------------------- processes


@dataclass
class Job:
    """One process of the fleet (for a namespaced one, ``proc`` is ``unshare``)."""

    role: str
    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    started: float
    namespace: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    signals: list[str] = field(default_factory=list)  # what the harness sent it
    stopped: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 1500) -> str:
        """The end of what it wrote: stdout (a --json report) unless it is a loader, then stderr."""
        text = (
            ""
            if self.role in ("loader", "reference") or not self.out.exists()
            else self.out.read_text(errors="replace")
        )
        text += self.err.read_text(errors="replace") if self.err.exists() else ""
        return text[-n:]

    def reason(self) -> str:
        """Why it failed, in one line: its last line on stderr, else the first failure its --json report names."""
        err = self.err.read_text(errors="replace").strip().splitlines() if self.err.exists() else []
        if err:
            return err[-1][:400]
        try:
            failed = json.loads(self.out.read_text()).get("failed") or [{}]
            return str(failed[0].get("error", failed[0]))[:400]
        except (OSError, ValueError, AttributeError):
            return "(no reason given)"

    def __str__(self) -> str:
        sent = ",".join(self.signals) or "-"
        return f"{self.name} pid {self.proc.pid} exit {self.proc.returncode} signals {sent}"


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[3])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


class Procs:
    """Spawns every process of the fleet in a session of its own and keeps track of them all."""

    def __init__(self, root: Path, env: Mapping[str, str]) -> None:
        self.root, self.env = root, dict(env)
        self.jobs: list[Job] = []
        self._count = 0

    def spawn(self, role: str, name: str, argv: Sequence[str], *, namespace: bool = False,
              nofile: int | None = None, **meta: Any) -> Job:  # fmt: skip
        self._count += 1
        stem = self.root / "logs" / f"{self._count:03d}-{name}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        if namespace:  # the writer is pid 2 there (sh is 1), so SIGTERM reaches it as anywhere else
            argv = ["unshare", "-pf", "--mount-proc", "--kill-child", "sh", "-c", '"$@"; exit $?', "sh", *argv]
        env = {**self.env, **({"FLEET_NOFILE": str(nofile)} if nofile is not None else {})}
        with open(f"{stem}.out", "wb") as out, open(f"{stem}.err", "wb") as err:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=err, env=env, cwd=ROOT,
                                    start_new_session=True)  # fmt: skip
        job = Job(role, name, proc, Path(f"{stem}.out"), Path(f"{stem}.err"), time.monotonic(), namespace, meta)
        self.jobs.append(job)
        return job

    def target_pid(self, job: Job) -> int | None:
        """The pid a fault is sent to: the process itself, or in a namespace the writer inside it."""
        if not job.namespace:
            return job.proc.pid
        for sh in _children(job.proc.pid):
            for inner in _children(sh):
                return inner
        return None

    def lingering(self, only: Job | None = None) -> list[str]:
        """Every live process in a session the fleet started (orphans included), as text."""
        sessions = {j.proc.pid: j for j in (self.jobs if only is None else [only])}
        out = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            st = _stat(int(entry))
            if st is None or st[0] in "ZX" or st[1] not in sessions:
                continue
            job = sessions[st[1]]
            if int(entry) == job.proc.pid and job.proc.poll() is not None:
                continue
            out.append(f"pid {entry} ({_cmdline(int(entry))}) of {job}")
        return out

    def kill_all(self) -> None:
        """SIGCONT + SIGKILL to every session the fleet started, then reap the direct children."""
        for job in self.jobs:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(job.proc.pid, sig)
        for job in self.jobs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.proc.wait(10)


# ---------------------------------------------------------------- commands


def ferry_argv(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "ferry", *args]


def pack_argv(inputs: Sequence[Path], out: str, *, append: bool, compression: str = "zstd:1",
              frame_size: str = "") -> list[str]:  # fmt: skip
    args = ["pack", *map(str, inputs), "--out", out, "--vocab-size", str(VOCAB), "--eos-id", str(EOS),
            "--shard-size", "4096", "--json", "--compression", compression]  # fmt: skip
    if append:
        args.append("--append")
    if frame_size:
        args += ["--frame-size", frame_size]
    return ferry_argv(*args)


def write_inputs(directory: Path, n: int, seed: int, docs: int) -> list[Path]:
    """``n`` JSONL files of ``docs`` token documents each (ids 1..3999; EOS is 0)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = directory / f"in-{seed}-{i}.jsonl"
        rows = [{"tokens": rng.integers(1, 4000, size=int(rng.integers(50, 400))).tolist()} for _ in range(docs)]
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(p)
    return paths


@dataclass(frozen=True)
class Topology:
    """Where the clusters are: origin and far are directories under ``root``, hub is ``hub_base`` on S3;
    ``swarm``: origin → hub and far as one rule, filled as a swarm, instead of the chain; ``routed``: that
    swarm follows the route planner over :data:`ROUTED_LINKS` (most of far's shards relayed by the hub);
    ``ray_address``: the daemons copy with the Ray engine on the cluster there."""

    root: Path
    hub_base: str
    storage_options: Mapping[str, Any]  # for the hub, in this process
    swarm: bool = False
    routed: bool = False
    ray_address: str | None = None  # every daemon copies as Ray tasks on the cluster there

    def cluster_url(self, name: str) -> str:
        return self.hub_base if name == "hub" else str(self.root / name)

    def url(self, where: str) -> str:
        return f"{self.cluster_url(where)}/{DATASET}" if where != "nvme" else str(self.root / "nvme" / DATASET)

    def options(self, where: str) -> dict[str, Any]:
        return dict(self.storage_options) if where == "hub" else {}


PRIORITIES = {"origin": {"origin": 1, "hub": 10, "far": 50}, "hub": {"hub": 1, "origin": 10, "far": 20},
              "far": {"far": 1, "hub": 10, "origin": 50}}  # fmt: skip


#: a routed swarm's [[links]]: origin → far narrow and dear, through the hub wide and cheap (planning figures
#: only: no copy is limited), so the plan relays most of far's shards through the hub
ROUTED_LINKS = [
    Link("origin", "hub", capacity=50e6, price_per_gb=0.02),
    Link("origin", "far", capacity=1e6, price_per_gb=0.09),
    Link(["hub", "far"], ["hub", "far"], capacity=50e6, price_per_gb=0.0),
]


def daemon_config(topo: Topology, me: str, port: int, keep_versions: int) -> Path:
    """ferry.toml of cluster ``me``'s daemon: rules origin → hub → far (or origin → hub and far as a
    swarm), fast polls, its own state."""
    chain = [Rule("origin", ["hub"], datasets="*"), Rule("hub", ["far"], datasets="*")]
    return FerryToml(
        clusters={c: Cluster(topo.cluster_url(c), priority=PRIORITIES[me][c]) for c in CLUSTERS},
        rules=[Rule("origin", ["hub", "far"], datasets="*")] if topo.swarm else chain,
        swarm=Swarm(enabled=True, interval=0.2, stale_after=2.0, routed=topo.routed or None) if topo.swarm else None,
        links=ROUTED_LINKS if topo.routed else None,
        transfer=Transfer(engine="ray", address=topo.ray_address) if topo.ray_address else None,
        limits=Limits(transfers=2, retries=3),
        api=Api(host="127.0.0.1", port=port),
        cluster=me,
        state_dir=topo.root / ("state-" + me),
        poll_interval=0.3,
        keep_versions=keep_versions if me == "hub" else 3,
    ).write(topo.root / f"ferry-{me}.toml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str, timeout: float) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return json.loads(resp.read())


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll ``check`` until truthy (returned) or ``timeout`` seconds passed (returns the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# ---------------------------------------------------------------- storage observation


def read_version(loc: Any) -> str | None:
    """The version ``manifest.json`` names at ``loc``, None if there is none (yet)."""
    from ferry.shard_tools.format.header import parse_header

    try:
        data = loc.read_bytes("manifest.json")
    except FileNotFoundError:
        return None
    return str(parse_header(data)["version_id"])


def history(loc: Any, chain: Sequence[Any]) -> list[str]:
    """The parent chain of ``loc``'s current version, newest first (read from ``chain``, first found)."""
    from ferry.shard_tools.format.header import parse_header

    out: list[str] = []
    v = read_version(loc)
    while v is not None and v not in out and len(out) < 10_000:
        out.append(v)
        parent = None
        for c in chain:
            with contextlib.suppress(FileNotFoundError):
                parent = parse_header(c.read_bytes(f"versions/{v}.json")).get("parent")
                break
        v = None if parent is None else str(parent)
    return out


class Ledger:
    """Size and digest of every ``shards/*`` and ``versions/*`` object when first seen, per place."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], tuple[int, str]] = {}
        self.changes: list[str] = []

    def scan(self, where: str, loc: Any, *, recheck: bool = False) -> None:
        from ferry.shard_tools.format.digest import digest_bytes
        from ferry.shard_tools.storage.store import TEMP_MARKER

        for prefix in ("shards", "versions"):
            loc.fs.invalidate_cache()
            try:
                found = loc.fs.find(loc.full(prefix), detail=True)
            except FileNotFoundError:
                continue
            for full, info in found.items():
                name = str(full).rsplit("/", 1)[-1]
                if TEMP_MARKER in name:
                    continue
                key, size = (where, f"{prefix}/{name}"), int(info.get("size") or 0)
                known = self.seen.get(key)
                if known is not None and not recheck:
                    if known[0] != size:
                        self.changes.append(f"{where}/{key[1]}: {known[0]} bytes when first seen, now {size}")
                        self.seen[key] = (size, known[1])
                    continue
                try:
                    data = loc.read_bytes(key[1])
                except FileNotFoundError:
                    continue  # retired meanwhile
                now = (len(data), digest_bytes(data))
                if known is None:
                    self.seen[key] = now
                elif known != now:
                    self.changes.append(f"{where}/{key[1]}: {known} when first seen, now {now}")
                    self.seen[key] = now


class Observer(threading.Thread):
    """Reads every destination's version all along (``versions``) and keeps the :class:`Ledger`."""

    def __init__(self, locs: Mapping[str, Any], scan_every: float = 1.5) -> None:
        super().__init__(daemon=True, name="fleet-observer")
        self.locs, self.scan_every = dict(locs), scan_every
        self.versions: dict[str, list[str]] = {w: [] for w in locs}
        self.ledger = Ledger()
        self.problems: list[str] = []
        self.stop = threading.Event()
        self.rounds = 0

    def poll_versions(self) -> None:
        for where, loc in self.locs.items():
            try:
                v = read_version(loc)
            except Exception as exc:  # noqa: BLE001 - an unreadable manifest is a finding
                self.problems.append(f"{where}: manifest.json unreadable: {exc!r}"[:300])
                continue
            seq = self.versions[where]
            if v is not None and (not seq or seq[-1] != v):
                seq.append(v)

    def scan(self, recheck: bool = False) -> None:
        for where, loc in self.locs.items():
            try:
                self.ledger.scan(where, loc, recheck=recheck)
            except Exception as exc:  # noqa: BLE001
                self.problems.append(f"{where}: listing failed: {exc!r}"[:300])

    def run(self) -> None:
        last_scan = 0.0
        while not self.stop.wait(0.25):
            self.poll_versions()
            if time.monotonic() - last_scan > self.scan_every:
                self.scan()
                last_scan = time.monotonic()
            self.rounds += 1


# ---------------------------------------------------------------- the slow-client flood


class Flood(threading.Thread):
    """``n`` sockets to 127.0.0.1:``port``, each sending one byte of a never-ending header per second,
    for ``seconds``; meanwhile a fresh client asks ``/healthz`` every 2 s (``probes``: answered or not)."""

    def __init__(self, port: int, n: int, seconds: float) -> None:
        super().__init__(daemon=True, name="fleet-flood")
        self.port, self.n, self.seconds = port, n, seconds
        self.opened = self.refused = self.closed_by_server = 0
        self.probes: list[tuple[float, bool, str]] = []
        self.after: tuple[bool, str] | None = None

    def _probe(self) -> tuple[bool, str]:
        try:
            http_get(self.port, "/healthz", timeout=10)
            return True, "ok"
        except Exception as exc:  # noqa: BLE001 - what the client saw is the finding
            return False, repr(exc)[:200]

    def run(self) -> None:
        header = b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
        socks: list[socket.socket] = []
        start = time.monotonic()
        try:
            for _ in range(self.n):
                s = socket.socket()
                s.setblocking(False)
                if s.connect_ex(("127.0.0.1", self.port)) not in (0, errno.EINPROGRESS):
                    self.refused += 1
                    s.close()
                    continue
                socks.append(s)
            self.opened = len(socks)
            for sec in range(int(self.seconds)):
                for s in list(socks):
                    try:
                        s.send(header[sec : sec + 1])
                    except BlockingIOError:
                        pass
                    except OSError:
                        self.closed_by_server += 1
                        socks.remove(s)
                if sec % 2 == 1:
                    ok, why = self._probe()
                    self.probes.append((time.monotonic() - start, ok, why))
                time.sleep(max(0.0, start + sec + 1 - time.monotonic()))
        finally:
            for s in socks:
                s.close()
        self.after = wait_for(lambda: (r := self._probe())[0] and r, 15.0, 1.0) or self._probe()


# ---------------------------------------------------------------- child entry points


def _ferry_main(args: list[str]) -> int:
    nofile = os.environ.get("FLEET_NOFILE")
    if nofile:  # the soft limit of open files (the hard one stays)
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    ttl = os.environ.get("FLEET_LEASE_TTL")
    if ttl:  # the lease ttl of the fleet's writers, so that a SIGSTOP outlasts it within the run
        import ferry.service.replication.engine
        import ferry.service.replication.lease

        assert ferry.service.replication.lease.Lease.__init__.__kwdefaults__ is not None
        assert ferry.service.replication.engine.Engine.__init__.__kwdefaults__ is not None
        ferry.service.replication.lease.Lease.__init__.__kwdefaults__["ttl"] = float(ttl)
        ferry.service.replication.engine.Engine.__init__.__kwdefaults__["lease_ttl"] = float(ttl)
    from ferry.shard_tools.cli import main

    return int(main(args) or 0)


def _load_main(args: list[str]) -> int:
    """OUT VERSION SEED WORKERS DELAY CACHE URL...: one sha256 line per batch of one epoch, then END."""
    out, version, seed, workers, delay, cache, *urls = args
    from ferry.client import TokenDataset, TokenLoader

    ds = TokenDataset(urls, seq_len=SEQ_LEN, seed=int(seed), shuffle="window", window=2, cache_dir=cache,
                      version=version)  # fmt: skip
    loader = TokenLoader(ds, batch_size=BATCH, num_workers=int(workers))
    with open(out, "w") as f:
        for batch in loader:
            f.write(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest() + "\n")
            f.flush()
            time.sleep(float(delay))  # a training step
        f.write("END\n")
    return 0


# ---------------------------------------------------------------- invariants (each: findings, [] when it holds)


def inv_no_version_lost(packs: Iterable[Job], origin_history: Sequence[str]) -> list[str]:
    """Every pack that exited 0 is on the origin's final history."""
    have = set(origin_history)
    out = []
    for job in packs:
        if job.proc.returncode == 0:
            v = json.loads(job.out.read_text())["version_id"]
            if v not in have:
                out.append(f"{job.name} published {v}, not on the origin's final history")
    return out


def inv_no_rollback(observed: Mapping[str, Sequence[str]], chain: Sequence[Any]) -> list[str]:
    """Each destination's version only moved forward along the parent chain."""
    from ferry.shard_tools.storage.publish import descends_from

    out = []
    for where, seq in observed.items():
        for older, newer in zip(seq, seq[1:], strict=False):
            ok, why = descends_from(chain, newer, older)
            if not ok:
                out.append(f"{where} moved from {older} to {newer}: {why}")
    return out


def inv_objects_immutable(ledger: Ledger) -> list[str]:
    """No published shards/* or versions/* object changed after it was first seen."""
    return list(ledger.changes)


def inv_loader_streams(loaders: Iterable[Job], reference: Sequence[str]) -> list[str]:
    """A loader that finished read exactly the reference stream; one the harness killed, a prefix of it."""
    loaders = list(loaders)
    out = []
    if loaders and not any(j.proc.returncode == 0 for j in loaders):
        out.append(f"none of the {len(loaders)} loaders finished its epoch")
    for job in loaders:
        lines = job.out.read_text().splitlines() if job.out.exists() else []
        done = lines[-1:] == ["END"]
        got = lines[:-1] if done else lines
        diverged = next((i for i, (a, b) in enumerate(zip(got, reference, strict=False)) if a != b), None)
        if diverged is not None or len(got) > len(reference):
            at = diverged if diverged is not None else len(reference)
            out.append(f"{job}: batch {at} differs from the reference read of {job.meta['version']}")
        elif job.proc.returncode == 0 and (not done or len(got) != len(reference)):
            out.append(f"{job}: exited 0 after {len(got)} of {len(reference)} batches")
        elif job.proc.returncode != 0 and not job.signals:
            out.append(f"{job}: failed on its own after {len(got)} batches: {job.tail(600)}")
    return out


def _ended_before_start(job: Job) -> bool:
    """A daemon SIGTERMed while still importing (before it logged its start) ends by the signal's default
    action: nothing had started, so there is nothing to stop cleanly."""
    log = job.err.read_text(errors="replace") if job.err.exists() else ""
    return job.proc.returncode == -signal.SIGTERM and "daemon started" not in log


def inv_clean_exits(jobs: Iterable[Job]) -> list[str]:
    """A process the harness did not signal exits 0, or 1 for a reason its role allows; never a traceback;
    a SIGTERMed daemon exits 0 (or by the signal, if it had not started yet)."""
    out = []
    for job in jobs:
        code, err = job.proc.returncode, job.tail(4000)
        if code is None:
            continue
        if "Traceback" in err:
            out.append(f"{job}: traceback on stderr: {err[-800:]}")
        elif job.signals == ["SIGTERM"] and job.role == "daemon" and code != 0 and not _ended_before_start(job):
            out.append(f"{job}: SIGTERMed daemon exited {code}: {err[-400:]}")
        elif not job.signals and code != 0:
            allowed = ALLOWED_FAILURES.get(job.role, ())
            if job.role == "loader" or (code == 1 and any(a in err for a in allowed)):
                continue  # a loader's failure is judged by inv_loader_streams
            out.append(f"{job}: exited {code} on its own: {job.reason()}")
    return out


def inv_flood_survived(flood: Flood | None) -> list[str]:
    """During the flood the daemon answered more than half of the probes, and answered right after it."""
    if flood is None:
        return []
    answered = sum(ok for _, ok, _ in flood.probes)
    out = []
    if flood.probes and answered * 2 <= len(flood.probes):
        out.append(f"answered {answered} of {len(flood.probes)} /healthz probes during a flood of "
                   f"{flood.opened} slow clients: {[why for _, ok, why in flood.probes if not ok][:3]}")  # fmt: skip
    if flood.after is None or not flood.after[0]:
        out.append(f"no answer to /healthz within 15 s after the flood: {flood.after}")
    return out


def inv_no_process_left(procs: Procs) -> list[str]:
    """Nothing the fleet started (or its children) is alive once every job is done."""
    wait_for(lambda: not procs.lingering(), LINGER_GRACE_S, 0.5)
    return procs.lingering()


def inv_swarm_history_read(peer_pulls: Mapping[str, int]) -> list[str]:
    """With the swarm, the fillers' transfer history reads (the copies between them are in the report: most runs
    have some, but with a fast origin a run may take every shard from it, so none is required)."""
    if not peer_pulls or any(n < 0 for n in peer_pulls.values()):
        return [f"the fillers' transfer history could not be read: {dict(peer_pulls)}"]
    return []


def inv_verify(env: Mapping[str, str], topo: Topology) -> list[str]:
    """``ferry verify`` passes at every destination."""
    procs = {
        where: subprocess.Popen(ferry_argv("verify", topo.url(where)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=dict(env), cwd=ROOT, text=True, start_new_session=True)
        for where in DESTINATIONS
    }  # fmt: skip
    out = []
    for where, p in procs.items():
        try:
            text, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            text, _ = p.communicate()
        if p.returncode != 0:
            out.append(f"{where}: ferry verify exited {p.returncode}: {text.strip()[-600:]}")
    return out


# ---------------------------------------------------------------- the run


SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigstop": signal.SIGSTOP}


class Fleet:
    """One run: set up, churn under the schedule, settle, check. ``findings`` maps invariant → findings."""

    def __init__(self, topo: Topology, sizes: Sizes, seed: int, env: Mapping[str, str], namespaces: bool,
                 off: frozenset[str] = frozenset()) -> None:  # fmt: skip
        from ferry.shard_tools.storage.store import resolve

        self.off = off
        self.topo, self.sizes, self.seed = topo, sizes, seed
        self.namespaces = namespaces and "namespace" not in off
        self.schedule = make_schedule(seed, sizes, self.namespaces, off)
        self.rng = random.Random(seed ^ 0x5EED)  # which live process a fault hits, namespaced syncs
        path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.env = {**env, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        if sizes.lease_ttl is not None:
            self.env["FLEET_LEASE_TTL"] = str(sizes.lease_ttl)
        self.procs = Procs(topo.root, self.env)
        self.ports = {c: free_port() for c in CLUSTERS}
        self.locs = {w: resolve(topo.url(w), topo.options(w)) for w in DESTINATIONS}
        self.observer = Observer(self.locs)
        self.daemons: dict[str, Job] = {}
        self.restarts: list[tuple[float, str]] = []
        self.conts: list[tuple[float, Job]] = []
        self.terms: list[tuple[float, Job]] = []
        self.flood: Flood | None = None
        self.fresh: list[Path] = []  # inputs not packed yet
        self.packed: list[Path] = []
        self.syncs_started = 0
        self.first = ""  # the version the loaders read
        self.loader_seed = seed % 1000
        self.reference: list[str] | None = None
        self.last_sync = -1.0
        self.peer_pulls: dict[str, int] = {}  # with the swarm: copies each filler verified from the other
        self.notes: list[str] = []
        self.findings: dict[str, list[str]] = {}
        self.t0 = time.monotonic()

    # ---- bookkeeping

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, msg: str) -> None:
        self.notes.append(f"{self.now():7.2f}s {msg}")

    def find(self, invariant: str, items: Iterable[str]) -> None:
        items = list(items)
        if items:
            self.findings.setdefault(invariant, []).extend(items)

    def jobs(self, role: str, live: bool = False) -> list[Job]:
        return [j for j in self.procs.jobs if j.role == role and (not live or (j.alive() and not j.stopped))]

    # ---- processes

    def start_daemon(self, name: str) -> Job:
        keep = 1000 if "retention" in self.off else self.sizes.keep_versions
        config = daemon_config(self.topo, name, self.ports[name], keep)
        argv = ferry_argv("serve", "--config", str(config), "--drain-timeout", "5")
        job = self.procs.spawn("daemon", f"daemon-{name}", argv, nofile=self.sizes.daemon_nofile, cluster=name)
        self.daemons[name] = job
        self.note(f"started {job.name} pid {job.proc.pid}")
        return job

    def start_sync(self, ns: bool = False) -> Job:
        argv = ferry_argv("sync", self.topo.url("hub"), self.topo.url("nvme"), "--json", "--transfers", "2",
                          "--retries", "2")  # fmt: skip
        job = self.procs.spawn("sync", f"sync{'-ns' if ns else ''}", argv, namespace=ns)
        self.syncs_started += 1
        self.last_sync = self.now()
        return job

    def start_pack(self, ev: Event) -> Job:
        repack = ev.opt("repack") and self.packed
        inputs = [self.rng.choice(self.packed)] if repack else [self.fresh.pop()]
        self.packed += inputs
        argv = pack_argv(inputs, self.topo.url("origin"), append=True, compression=ev.opt("compression"),
                         frame_size=ev.opt("frame_size"))  # fmt: skip
        name = f"pack{'-ns' if ev.opt('namespace') else ''}{'-repack' if repack else ''}"
        job = self.procs.spawn("pack", name, argv, namespace=bool(ev.opt("namespace")))
        self.note(f"started {job.name} pid {job.proc.pid} {inputs[0].name} {ev.opt('compression')} "
                  f"frame={ev.opt('frame_size') or 'default'}")  # fmt: skip
        return job

    def loader_argv(self, out: Path, version: str, seed: int, workers: int, delay: float, urls: list[str]) -> list[str]:
        cache = out.with_suffix(".cache")
        return [sys.executable, str(Path(__file__).resolve()), "load", str(out), version, str(seed), str(workers),
                str(delay), str(cache), *urls]  # fmt: skip

    def start_loader(self) -> Job:
        version, seed = self.first, self.loader_seed
        out = self.topo.root / "logs" / f"stream-{len(self.jobs('loader'))}.txt"
        urls = [self.topo.url("far"), self.topo.url("hub"), self.topo.url("origin")]
        argv = self.loader_argv(out, version, seed, 1, self.sizes.loader_delay_s, urls)
        job = self.procs.spawn("loader", "loader", argv, version=version, seed=seed)
        job.out = out
        self.note(f"started loader pid {job.proc.pid} on {version} seed {seed}")
        return job

    # ---- faults

    def targets(self, role: str) -> list[Job]:
        terminating = {id(j) for _, j in self.terms}
        live = [j for j in self.jobs(role, live=True) if id(j) not in terminating and "SIGKILL" not in j.signals]
        if role == "loader":  # one that has started delivering batches
            live = [j for j in live if j.out.exists() and j.out.stat().st_size > 0]
        if role == "daemon" and self.flood is not None and self.flood.is_alive():
            live = [j for j in live if j.meta["cluster"] != "hub"]  # the flood's daemon is left alone meanwhile
        return live

    def send(self, job: Job, sig: signal.Signals) -> bool:
        pid = self.procs.target_pid(job)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            job.signals.append(sig.name)
            return True
        return False

    def fault(self, ev: Event) -> bool:
        """Sends the event's signal to a live process of its role; False: none yet (tried again)."""
        live = self.targets(ev.role)
        if not live:
            return False
        job = self.rng.choice(live)
        if not self.send(job, SIGNALS[ev.kind]):
            return False
        self.note(f"{ev.kind.upper()} {job.name} pid {job.proc.pid}")
        ttl = self.sizes.lease_ttl if self.sizes.lease_ttl is not None else 60.0
        if ev.kind == "sigstop":
            job.stopped = True
            self.conts.append((self.now() + ttl + 1.5, job))
        elif ev.kind == "sigterm":
            self.terms.append((self.now() + TERM_GRACE_S, job))
        if job.role == "daemon":
            self.restarts.append((self.now() + (ttl + 2.0 if ev.kind == "sigstop" else 1.0), job.meta["cluster"]))
        return True

    def terminating(self, job: Job) -> bool:
        return any(j is job for _, j in self.terms)

    def start_flood(self, ev: Event) -> bool:
        """Starts the flood once the target daemon runs and listens; False: not yet (tried again)."""
        target = str(ev.opt("target"))
        daemon = self.daemons[target]
        if not daemon.alive() or daemon.stopped or self.terminating(daemon) or not listening(self.ports[target]):
            return False
        self.flood = Flood(self.ports[target], self.sizes.flood_sockets, self.sizes.flood_s)
        self.flood.start()
        self.note(f"flood of {self.sizes.flood_sockets} slow clients against the {target} daemon")
        return True

    # ---- the loop

    def due_conts(self, t: float) -> None:
        for at, job in [c for c in self.conts if c[0] <= t]:
            self.conts.remove((at, job))
            self.send(job, signal.SIGCONT)
            job.stopped = False
            self.note(f"SIGCONT {job.name} pid {job.proc.pid}")

    def due_restarts(self, t: float) -> None:
        for at, name in [r for r in self.restarts if r[0] <= t]:
            self.restarts.remove((at, name))
            old = self.daemons[name]
            if old.alive() and (old.stopped or self.terminating(old)):
                self.restarts.append((t + 0.5, name))  # still stopped, or draining after SIGTERM
            elif not old.alive():
                self.start_daemon(name)  # (alive and running: it was SIGSTOPped and is continued)

    def due_terms(self, t: float) -> None:
        for at, job in [x for x in self.terms if x[0] <= t]:
            self.terms.remove((at, job))
            if job.alive():
                self.find("sigterm_exits", [f"{job} still alive {TERM_GRACE_S:.0f} s after SIGTERM"])
                self.send(job, signal.SIGKILL)

    def due_exits(self, t: float) -> None:
        """A process that ended by itself or on SIGTERM has stopped its children ``EXIT_GRACE_S`` later
        (after SIGKILL they may take longer to notice: the end-of-run check covers those)."""
        for job in self.procs.jobs:
            if job.proc.poll() is None or "exit_checked" in job.meta:
                continue
            if "exited_at" not in job.meta:
                job.meta["exited_at"] = t
            elif t - job.meta["exited_at"] >= EXIT_GRACE_S:
                job.meta["exit_checked"] = True
                if "SIGKILL" not in job.signals:
                    left = self.procs.lingering(job)
                    self.find("no_process_left", [f"{EXIT_GRACE_S:.0f} s after {job} ended: {p}" for p in left])

    def due_loaders(self, t: float) -> None:
        """A loader that ended (killed, or done with its epoch) is followed by a new one from scratch while
        the churn lasts (a job restarted, the next job), up to three times as many loaders as at the start."""
        for job in self.jobs("loader"):
            if job.proc.poll() is None or "replaced" in job.meta or t >= self.sizes.churn_s:
                continue
            job.meta["replaced"] = True
            if len(self.jobs("loader")) < 3 * self.sizes.loaders:
                self.start_loader()

    def follow(self, t: float) -> None:
        """A follower sync whenever none runs (at most every 2 s), sometimes two at once (a cron job that
        outlived its period)."""
        limit = int(self.sizes.churn_s)
        if not self.jobs("sync", live=True) and t - self.last_sync > 2.0 and self.syncs_started < limit:
            ns = self.namespaces and self.rng.random() < 0.4
            self.start_sync(ns)
            if self.rng.random() < 0.4:
                self.start_sync(self.namespaces and not ns)

    def tick(self, follow: bool = True) -> None:
        t = self.now()
        self.due_conts(t)
        self.due_restarts(t)
        self.due_terms(t)
        self.due_exits(t)
        self.due_loaders(t)
        if follow:
            self.follow(t)

    def churn(self) -> None:
        self.t0 = time.monotonic()
        pending = list(self.schedule)
        actions: dict[str, Callable[[Event], Any]] = {
            "pack": self.start_pack, "flood": self.start_flood,
            "sigkill": self.fault, "sigterm": self.fault, "sigstop": self.fault,
        }  # fmt: skip
        while self.now() < self.sizes.churn_s + 1.0:  # bounded by time; every step below is bounded too
            for ev in [e for e in pending if e.at <= self.now()]:
                pending.remove(ev)
                if actions[ev.kind](ev) is False:  # not yet: tried again in 0.5 s, until the churn ends
                    pending.append(Event(self.now() + 0.5, ev.kind, ev.role, ev.opts))
            self.tick()
            time.sleep(0.05)
        for ev in sorted(pending, key=lambda e: e.at):
            self.note(f"not run by the end of the churn: {ev}")

    # ---- before and after

    def setup(self) -> bool:
        """Inputs, the first version at the origin, the daemons, the reference read of that version
        (no faults yet), and that version at hub and far."""
        s = self.sizes
        first = write_inputs(self.topo.root / "inputs", s.initial_inputs, self.seed, s.docs_per_input)
        self.fresh = write_inputs(self.topo.root / "inputs", s.packers, self.seed + 1, s.docs_per_input)
        job = self.procs.spawn("pack", "pack-initial", pack_argv(first, self.topo.url("origin"), append=False))
        if job.proc.wait(120) != 0:
            self.find("setup", [f"the first pack failed: {job.tail()}"])
            return False
        self.packed += first
        self.first = str(read_version(self.locs["origin"]))
        self.note(f"packed {self.first} at the origin")
        self.observer.start()
        for name in CLUSTERS:
            self.start_daemon(name)
        for _ in range(s.loaders):  # they start now: a training job takes a while to deliver its first batch
            self.start_loader()
        path = self.topo.root / "logs" / "reference.txt"
        argv = self.loader_argv(path, self.first, self.loader_seed, 0, 0.0, [self.topo.url("origin")])
        ref = self.procs.spawn("reference", "reference", argv)
        ref.out = path
        try:
            ref.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.send(ref, signal.SIGKILL)
        lines = path.read_text().splitlines() if path.exists() else []
        if lines[-1:] != ["END"]:
            self.find("setup", [f"the reference read of {self.first} failed: {ref.tail()}"])
            return False
        self.reference = lines[:-1]
        self.note(f"reference read: {len(self.reference)} batches")
        if not wait_for(lambda: all(read_version(self.locs[c]) == self.first for c in ("hub", "far")), 90.0):
            self.find("setup", [f"the first version {self.first} did not reach hub and far in 90 s"])
            return False
        self.note(f"setup done: {self.first} at origin, hub and far")
        return True

    def wait(self, check: Callable[[], Any], timeout: float) -> Any:
        """:func:`wait_for`, keeping up the harness's own duties (SIGTERM deadlines, exits) meanwhile."""

        def ticked() -> Any:
            self.tick(follow=False)
            return check()

        return wait_for(ticked, timeout)

    def wait_role(self, role: str, timeout: float) -> None:
        """Until every process of ``role`` has exited; past ``timeout``, a finding and SIGKILL."""
        if self.wait(lambda: not any(j.alive() for j in self.jobs(role)), timeout):
            return
        for job in self.jobs(role):
            if job.alive():
                self.find("bounded", [f"{job} still running {timeout:.0f} s after the faults stopped"])
                self.send(job, signal.SIGKILL)
                job.proc.wait(10)

    def settle(self) -> None:
        """Faults stop: continue the stopped, let the writers end, run every daemon, converge."""
        for _, job in self.conts:
            self.send(job, signal.SIGCONT)
            job.stopped = False
        self.conts.clear()
        self.wait_role("pack", 90.0)
        self.wait_role("sync", 60.0)
        if self.flood is not None:
            self.flood.join(self.sizes.flood_s + 40.0)
        for name in CLUSTERS:
            if not self.daemons[name].alive():
                self.start_daemon(name)
        self.restarts.clear()
        final = read_version(self.locs["origin"])
        self.note(f"faults stopped; the origin publishes {final}")
        started = time.monotonic()
        if not self.wait(
            lambda: all(read_version(self.locs[c]) == final for c in ("hub", "far")), self.sizes.converge_s
        ):
            where = {c: read_version(self.locs[c]) for c in ("hub", "far")}
            self.find("converge", [f"not at the origin's {final} {self.sizes.converge_s:.0f} s after the faults "
                                   f"stopped: {where}; open errors: {self.daemon_errors()}"])  # fmt: skip
        else:
            self.note(f"hub and far converged in {time.monotonic() - started:.1f} s")
        last = self.start_sync()
        try:
            code = last.proc.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0 or read_version(self.locs["nvme"]) != final:
            self.find("converge", [f"the last follower sync {last} left nvme at {read_version(self.locs['nvme'])}, "
                                   f"not {final}: {last.reason()}"])  # fmt: skip
        self.wait_role("loader", 120.0)
        if self.topo.swarm:
            self.peer_pulls = self.count_peer_pulls()
            self.note(f"verified copies between the fillers (destination: count): {self.peer_pulls}")
        for job in self.daemons.values():
            self.send(job, signal.SIGTERM)
            self.terms.append((self.now() + TERM_GRACE_S, job))
        self.wait(lambda: not any(j.alive() for j in self.daemons.values()), TERM_GRACE_S)
        self.due_terms(float("inf"))
        self.wait(lambda: all("exit_checked" in j.meta for j in self.procs.jobs), EXIT_GRACE_S + 2.0)

    def count_peer_pulls(self) -> dict[str, int]:
        """Verified copies hub and far made from each other, from their daemons' transfer history (kept
        in their state across restarts), or -1 where the history could not be read."""
        out: dict[str, int] = {}
        for me, peer in (("hub", "far"), ("far", "hub")):
            try:
                entries = http_get(self.ports[me], "/api/v1/history?limit=1000", 10.0)
            except Exception as exc:  # noqa: BLE001 - reported by check()
                self.note(f"cannot read the {me} daemon's history: {exc!r}"[:200])
                out[me] = -1
                continue
            out[me] = sum(1 for e in entries if e.get("ok") and e.get("source") == peer)
        return out

    def daemon_errors(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in CLUSTERS:
            try:
                out[name] = [e.get("reason", e) for e in http_get(self.ports[name], "/api/v1/errors", 5.0)][:3]
            except Exception as exc:  # noqa: BLE001 - only for the report
                out[name] = repr(exc)[:120]
        return out

    def check(self) -> None:
        """Every invariant, into ``findings``."""
        self.observer.stop.set()
        self.observer.join(30)
        self.observer.poll_versions()
        self.observer.scan(recheck=True)
        self.find("observer", self.observer.problems)
        origin_history = history(self.locs["origin"], [self.locs["origin"]])
        self.find("no_version_lost", inv_no_version_lost(self.jobs("pack"), origin_history))
        self.find("no_rollback", inv_no_rollback(self.observer.versions, [self.locs["origin"]]))
        self.find("objects_immutable", inv_objects_immutable(self.observer.ledger))
        assert self.reference is not None
        self.find("loader_streams", inv_loader_streams(self.jobs("loader"), self.reference))
        self.find("clean_exits", inv_clean_exits(self.procs.jobs))
        self.find("flood_survived", inv_flood_survived(self.flood))
        self.find("verify", inv_verify(self.env, self.topo))
        self.find("no_process_left", inv_no_process_left(self.procs))
        if self.topo.swarm:
            self.find("swarm_history", inv_swarm_history_read(self.peer_pulls))

    def report(self) -> str:
        off = f", left out: {','.join(sorted(self.off))}" if self.off else ""
        lines = [f"fleet chaos run: seed {self.seed} (rerun with FERRY_CHAOS_SEED={self.seed}){off}, {self.sizes}",
                 "schedule:", *(f"  {e}" for e in self.schedule), "what happened:", *(f"  {n}" for n in self.notes),
                 "versions seen:", *(f"  {w}: {' -> '.join(v[:8] for v in vs)}" for w, vs in
                                     self.observer.versions.items()),
                 "processes:", *(f"  {j.role:9} {j}" for j in self.procs.jobs)]  # fmt: skip
        if self.flood is not None:
            f = self.flood
            lines.append(f"flood: {f.opened} opened, {f.refused} refused, {f.closed_by_server} closed by the server, "
                         f"probes {[(round(t, 1), ok) for t, ok, _ in f.probes]}, after {f.after}")  # fmt: skip
        lines.append("FINDINGS:" if self.findings else "every invariant held")
        for inv, items in self.findings.items():
            lines.append(f"  [{inv}]")
            lines += [f"    - {i}" for i in items[:12]] + (
                [f"    ... {len(items) - 12} more"] if len(items) > 12 else []
            )
        for job in self.daemons.values():
            lines += [f"--- last log of {job.name} ({job.err.name})", job.tail(2500)]
        return "\n".join(lines)


def run_fleet(topo: Topology, sizes: Sizes, seed: int, env: Mapping[str, str], namespaces: bool,
              off: frozenset[str] = frozenset()) -> Fleet:  # fmt: skip
    """Run the whole fleet once; every process it started is gone when this returns."""
    fleet = Fleet(topo, sizes, seed, env, namespaces, off)
    try:
        if fleet.setup():
            fleet.churn()
            fleet.settle()
            fleet.check()
    finally:
        fleet.observer.stop.set()
        fleet.procs.kill_all()
    return fleet


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1] == "ferry":
        sys.exit(_ferry_main(sys.argv[2:]))
    sys.exit(_load_main(sys.argv[2:]))
