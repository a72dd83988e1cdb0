"""Load on the service API while a sync runs: latency of ``/api/v1/replicas`` and the sync's throughput.

    .venv/bin/python bench/service_load.py            # 1 GiB of tokens, 50 clients, 9 cycles of 3 modes
    .venv/bin/python bench/service_load.py --quick    # 128 MiB, 1 cycle

Each cycle starts a real ``ferry serve`` process (daemon + API) replicating local "east" → "west"
and runs three syncs in it, one per mode: it drops a pre-packed dataset under a new name into
east (a rename), asks for a sync of that dataset, and times until west's manifest appears.
"loaded" syncs run with a separate load process: ``--clients`` concurrent clients polling
``/api/v1/replicas`` every ``--interval`` seconds plus one SSE stream on ``/api/v1/events``.
"floor" syncs point the same load at a stand-in server (fixed bytes, raw asyncio, another
process) while ferry syncs: the loss the load's own CPU causes on this machine with no API work
in ferry at all. Targets: p99 < 100 ms, throughput loss < 10 %. The last stdout line is JSON.

The clusters live on tmpfs (``/dev/shm``) when it has room: on disk the kernel's writeback makes
the same baseline sync vary from run to run by more than the effect measured. On tmpfs the sync
is bound by ferry's own work, the hardest case for "the API must not slow replication". 1 GiB of
tokens, and each dataset is deleted after its sync: tmpfs memory in use beyond a few GiB can be
slow to fill (the kernel's memcpy into fresh tmpfs pages), and a sync that crosses that line is
slower whatever the mode. docs/architecture.md gives the numbers.

Noise control (the same sync's speed moves within minutes on a shared machine): one discarded
warm-up sync; a cycle's three syncs run seconds apart in one process; every mode waits the
same time before its sync starts; the order of the modes rotates from cycle to cycle; and
besides the medians of each mode the result gives the *paired* loss, the median over cycles of
one cycle's loaded/baseline ratio, which cancels the machine's drift between cycles. ferry names its
threads in the OS, so the CPU of the ``ferry-api`` thread (everything HTTP: requests, SSE)
during the sync is read from ``/proc`` and reported next to the serve process's total.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _wait_listening(url: str, timeout: float = 20) -> None:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens at {url}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat_cpu(stat: Path) -> float:
    """User + system CPU seconds from a ``/proc/.../stat`` file (a process or one of its threads)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; NaN elsewhere)."""
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat"))
    except OSError:
        return float("nan")


def _thread_cpu(pid: int, name: str) -> float:
    """CPU seconds of the live threads of ``pid`` whose OS name is ``name`` (0 when none)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if (task / "comm").read_text().strip() == name:
                total += _stat_cpu(task / "stat")
        except OSError:
            continue  # the thread ended meanwhile
    return total


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# ---- the load process ---------------------------------------------------------------------------------------------


async def _load(url: str, clients: int, interval: float, stop_file: Path) -> dict[str, Any]:
    latencies: list[tuple[float, float]] = []  # (wall time, seconds)
    failures = 0
    events = 0
    started = time.perf_counter()
    host, port = url.split("//", 1)[1].rsplit(":", 1)[0], int(url.rsplit(":", 1)[1])

    async def poller(i: int) -> None:
        # a minimal keep-alive HTTP/1.1 client: httpx's own CPU cost would dominate on a small machine
        nonlocal failures
        await asyncio.sleep(interval * i / clients)  # spread the clients over one interval
        reader, writer = await asyncio.open_connection(host, port)
        request = f"GET /api/v1/replicas HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
        try:
            while not stop_file.exists():
                t0 = time.perf_counter()
                try:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise ValueError(head[:40])
                    latencies.append((time.time(), time.perf_counter() - t0))
                except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
                    failures += 1
                    return
                await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))
        finally:
            writer.close()

    async def sse() -> None:
        # raw reader too: counting frames in the bytes costs the load process next to nothing
        # (httpx's line iterator cost more CPU per event than the server spends sending it)
        nonlocal events
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /api/v1/events HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise ValueError(head[:40])
            tail = b"\n"  # frames start a line; keep the last bytes so a marker split across reads counts once
            while not stop_file.exists():
                data = await reader.read(65536)
                if not data:
                    return
                joined = tail + data
                events += joined.count(b"\nevent:")
                tail = joined[-6:]  # shorter than the marker: a whole one is never counted twice
        finally:
            writer.close()

    async def watch_stop(tasks: list[asyncio.Task[None]]) -> None:
        while not stop_file.exists():
            await asyncio.sleep(0.05)
        await asyncio.sleep(interval)
        for t in tasks:
            t.cancel()

    tasks = [asyncio.create_task(poller(i)) for i in range(clients)] + [asyncio.create_task(sse())]
    await asyncio.gather(watch_stop(tasks), *tasks, return_exceptions=True)
    return {
        "requests": len(latencies),
        "failures": failures,
        "sse_events": events,
        "latencies": latencies,
        "seconds": time.perf_counter() - started,
    }


async def _stand_in(port: int, body: bytes) -> None:
    """The cheapest server for the same load: fixed bytes for every poll, a frame every 0.1 s on SSE."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                if request.startswith(b"GET /api/v1/events"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
                    while True:
                        writer.write(b"event: progress\ndata: {}\n\n")
                        await writer.drain()
                        await asyncio.sleep(0.1)
                writer.write(head + body)
        except (OSError, asyncio.IncompleteReadError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def stand_in_worker(args: argparse.Namespace) -> int:
    asyncio.run(_stand_in(args.stand_in, b"x" * args.body_bytes))
    return 0


def load_worker(args: argparse.Namespace) -> int:
    res = asyncio.run(_load(args.load_worker, args.clients, args.interval, Path(args.stop_file)))
    print(json.dumps(res))
    return 0


# ---- the orchestrator ---------------------------------------------------------------------------------------------


def _tmpfs_with_room(nbytes: int) -> str | None:
    """``/dev/shm`` when it is a tmpfs with ``nbytes`` free, else None (the system temp dir)."""
    shm = Path("/dev/shm")
    try:
        return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > nbytes else None
    except OSError:
        return None


def _pack(path: Path, mib: int) -> tuple[int, int]:
    from ferry.shard_tools.packer.packing import PackOptions, pack_documents

    rng = np.random.default_rng(7)
    tokens = mib * 2**20 // 2
    docs = (rng.zipf(1.2, size=4096) % 50_000 for _ in range(tokens // 4096))
    res = pack_documents(docs, str(path), PackOptions(vocab_size=50_257, eos_id=50_256, shard_size=4 << 20))
    return res.stored_bytes, res.shards


def _config(root: Path, port: int) -> Path:
    text = f"""state_dir = "state"
poll_interval = 30
[clusters.east]
url = "east"
[clusters.west]
url = "west"
[[rules]]
from = "east"
to = ["west"]
[limits]
transfers = 4
[api]
port = {port}
token_env = "BENCH_TOKEN"
"""
    (root / "ferry.toml").write_text(text)
    return root / "ferry.toml"


class Serve:
    """One ``ferry serve`` (daemon + API) over fresh east/west directories; a context manager."""

    def __init__(self, work: Path) -> None:
        self.root = Path(tempfile.mkdtemp(dir=work, prefix="cycle-"))
        (self.root / "east").mkdir()
        (self.root / "west").mkdir()
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", str(_config(self.root, port))],
            cwd=self.root, env={**os.environ, "BENCH_TOKEN": "bench"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def __enter__(self) -> Serve:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError("ferry serve did not start")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def one_sync(serve: Serve, packed: Path, stored: int, name: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Replicate a new dataset ``name`` east → west in a running ``serve``, under ``mode``: "baseline" (no
    load), "loaded" (the load on ferry's API) or "floor" (the same load on a stand-in server in another
    process: what the load costs the sync with no API work at all)."""
    os.sync()  # dirty pages of earlier work are written back outside the clock
    pid, url = serve.proc.pid, serve.url
    stop_file = serve.root / f"stop-{name}"
    load = stand_in = None
    try:
        target = url
        if mode == "floor":
            target = f"http://127.0.0.1:{_free_port()}"
            body = len(httpx.get(url + "/api/v1/replicas", timeout=5).content)  # as long as ferry's answer
            stand_in = subprocess.Popen(
                [sys.executable, __file__, "--stand-in", target.rsplit(":", 1)[1], "--body-bytes", str(body)]
            )
            _wait_listening(target)
        if mode != "baseline":
            load = subprocess.Popen(
                [sys.executable, __file__, "--load-worker", target, "--clients", str(args.clients),
                 "--interval", str(args.interval), "--stop-file", str(stop_file)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(_SETTLE)  # warm up: every client connected and polling
            a0, s0, l0 = time.time(), _cpu_seconds(pid), _cpu_seconds(load.pid)
            time.sleep(_IDLE_WINDOW)  # an idle window under load: CPU per request of the server and of the clients
            a1, s1, l1 = time.time(), _cpu_seconds(pid), _cpu_seconds(load.pid)
        else:
            time.sleep(_SETTLE + _IDLE_WINDOW)  # the same pause before the sync in every mode
        incoming = serve.root / "east" / f".incoming-{name}"
        shutil.copytree(packed, incoming)
        incoming.rename(serve.root / "east" / name)  # appears at once
        cpu0, api0 = _cpu_seconds(pid), _thread_cpu(pid, "ferry-api")
        t0 = time.perf_counter()
        wall0 = time.time()
        httpx.post(url + "/api/v1/sync", headers={"Authorization": "Bearer bench"}, json={}, timeout=10)
        manifest = serve.root / "west" / name / "manifest.json"
        while not manifest.exists():
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("sync did not finish in 600 s")
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        wall1 = time.time()
        out: dict[str, Any] = {
            "seconds": seconds,
            "mib_per_s": stored / 2**20 / seconds,
            "server_cpu_s": _cpu_seconds(pid) - cpu0,  # the serve process during the sync
            "api_cpu_s": _thread_cpu(pid, "ferry-api") - api0,  # its HTTP thread (requests, SSE)
        }
        if load is not None:
            time.sleep(0.5)
            stop_file.touch()
            stdout, _ = load.communicate(timeout=60)
            res = json.loads(stdout.strip().splitlines()[-1])
            during = [lat for t, lat in res["latencies"] if wall0 <= t <= wall1]
            idle_requests = sum(1 for t, _ in res["latencies"] if a0 <= t <= a1)
            out["idle_window"] = {"requests": idle_requests, "seconds": a1 - a0, "server_cpu_s": s1 - s0,
                                  "client_cpu_s": l1 - l0}  # fmt: skip
            out.update(
                requests=res["requests"], failures=res["failures"], sse_events=res["sse_events"],
                latencies=[lat for _, lat in res["latencies"]], latencies_during_sync=during,
                load_seconds=res["seconds"],
            )  # fmt: skip
        return out
    finally:
        stop_file.touch()
        for proc in (load, stand_in):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for side in ("east", "west"):  # the same memory in use at every sync: see the module's docstring
            shutil.rmtree(serve.root / side / name, ignore_errors=True)


_SETTLE = 0.7
_IDLE_WINDOW = 1.5
_MODES = ("baseline", "loaded", "floor")


def _paired_loss(results: dict[str, list[dict[str, Any]]], mode: str, against: str = "baseline") -> float:
    """Median over cycles of 1 - mode/against within the same cycle, in percent."""
    ratios = [m["mib_per_s"] / a["mib_per_s"] for m, a in zip(results[mode], results[against], strict=True)]
    return round(100 * (1 - statistics.median(ratios)), 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=None, help="dataset size in MiB of raw tokens (default 1024; quick 128)")
    p.add_argument("--clients", type=int, default=50, help="concurrent polling clients (default 50)")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between one client's polls (default 0.25)")
    p.add_argument("--runs", type=int, default=None, help="cycles, each one run per mode (default 9; quick 1)")
    p.add_argument(
        "--workdir", default=None, help="where the clusters live (default: /dev/shm if it has room, else the temp dir)"
    )
    p.add_argument("--quick", action="store_true", help="small and fast")
    p.add_argument("--json", action="store_true", help="print only the JSON result line")
    p.add_argument("--load-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--stop-file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--stand-in", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--body-bytes", type=int, default=1000, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load_worker:
        return load_worker(args)
    if args.stand_in:
        return stand_in_worker(args)
    mib = args.mib or (128 if args.quick else 1024)
    runs = args.runs or (1 if args.quick else 9)
    workdir = args.workdir or _tmpfs_with_room(4 * mib * 2**20)

    def say(msg: str) -> None:
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="ferry-service-load-", dir=workdir) as tmp:
        work = Path(tmp)
        packed = work / "packed"
        stored, shards = _pack(packed, mib)
        say(f"packed {stored / 2**20:.1f} MiB in {shards} shards")
        with Serve(work) as serve:  # first touch of tmpfs memory, caches: not counted
            warm = one_sync(serve, packed, stored, "warm-up", "baseline", args)
        say(f"warm-up (not counted): {warm['mib_per_s']:.1f} MiB/s")
        results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in _MODES}
        errors = 0  # errors the daemon reported: a clean run has none
        for i in range(runs):
            with Serve(work) as serve:  # one serve per cycle: its three syncs run seconds apart
                for mode in _MODES[i % 3 :] + _MODES[: i % 3]:  # rotate: no mode always runs first or last
                    r = one_sync(serve, packed, stored, f"data-{mode}", mode, args)
                    say(f"cycle {i + 1}/{runs} {mode}: {r['mib_per_s']:.1f} MiB/s, serve CPU "
                        f"{r['server_cpu_s']:.2f} s (HTTP thread {r['api_cpu_s']:.2f} s)")  # fmt: skip
                    results[mode].append(r)
                errors += len(httpx.get(serve.url + "/api/v1/errors", timeout=10).json())
    base = statistics.median(r["mib_per_s"] for r in results["baseline"])
    loaded = statistics.median(r["mib_per_s"] for r in results["loaded"])
    floor = statistics.median(r["mib_per_s"] for r in results["floor"])
    lat = [x for r in results["loaded"] for x in r["latencies"]]
    lat_sync = [x for r in results["loaded"] for x in r["latencies_during_sync"]]
    req = sum(r["requests"] for r in results["loaded"])
    dur = sum(r["load_seconds"] for r in results["loaded"])
    idle = max(1, sum(r["idle_window"]["requests"] for r in results["loaded"]))
    out = {
        "dataset_mib": round(stored / 2**20, 1),
        "shards": shards,
        "clients": args.clients,
        "poll_interval_s": args.interval,
        "runs_per_mode": runs,
        "requests": req,
        "failures": sum(r["failures"] for r in results["loaded"]),
        "daemon_errors": errors,
        "sse_events": sum(r["sse_events"] for r in results["loaded"]),
        "latency_ms": {
            "p50": round(_pct(lat, 50) * 1e3, 2),
            "p99": round(_pct(lat, 99) * 1e3, 2),
            "max": round(max(lat) * 1e3, 2) if lat else None,
        },  # fmt: skip
        "latency_during_sync_ms": {
            "p50": round(_pct(lat_sync, 50) * 1e3, 2),
            "p99": round(_pct(lat_sync, 99) * 1e3, 2),
            "samples": len(lat_sync),
        },  # fmt: skip
        "requests_per_s": round(req / dur, 1) if dur else None,
        "cpu_ms_per_request": {
            "server": round(1e3 * sum(r["idle_window"]["server_cpu_s"] for r in results["loaded"]) / idle, 3),
            "clients": round(1e3 * sum(r["idle_window"]["client_cpu_s"] for r in results["loaded"]) / idle, 3),
        },
        "server_cpu_s_during_sync": {
            mode: round(statistics.median(r["server_cpu_s"] for r in results[mode]), 3) for mode in results
        },
        # the ferry-api thread alone (uvicorn's loop: every request and the SSE stream)
        "api_thread_cpu_s_during_sync": {
            mode: round(statistics.median(r["api_cpu_s"] for r in results[mode]), 3) for mode in results
        },
        "workdir": "tmpfs" if workdir else "temp dir",
        "cpu_cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "sync_mib_per_s": {"baseline": round(base, 1), "loaded": round(loaded, 1), "floor": round(floor, 1)},
        "runs_mib_per_s": {mode: [round(r["mib_per_s"], 1) for r in results[mode]] for mode in results},
        "throughput_loss_pct": round(100 * (1 - loaded / base), 1),
        # the same load answered by a stand-in server in another process: the loss from the load's
        # own CPU (clients + the cheapest possible server) on this machine, with no API work in ferry
        "throughput_loss_floor_pct": round(100 * (1 - floor / base), 1),
        # medians over cycles of the ratio within one cycle (cancels the machine's drift between cycles)
        "paired_loss_pct": _paired_loss(results, "loaded"),
        "paired_loss_floor_pct": _paired_loss(results, "floor"),
        "paired_loss_beyond_floor_pct": _paired_loss(results, "loaded", against="floor"),
        "targets": {"p99_ms_below": 100, "loss_pct_below": 10},
    }
    out["targets_met"] = bool(out["latency_ms"]["p99"] < 100 and out["throughput_loss_pct"] < 10)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
