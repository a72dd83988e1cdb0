"""Manifest cost at scale: synthetic manifests of 1k … 1M shards, measured end to end.

For each size N a fresh child process builds a shard table with realistic columns
(``shards/<32 hex>.arrow.zst`` paths, ``xxh128:`` digests, ~128 MiB raw / ~100 MB stored
per shard), publishes it with ``publish_version`` into a temp directory (no shard bytes),
then measures what a reader pays: ``load_manifest`` (header + table read, digest checks,
validation), locating samples (``searchsorted`` on ``token_offsets``), and the peak RSS.
Optional sections time the replication planner and the loader's start-up where those
modules exist (``--planner``, ``--loader``).

Usage::

    .venv/bin/python bench/scale_manifest.py                      # 1k, 10k, 100k, 1M
    .venv/bin/python bench/scale_manifest.py --sizes 100000 --repeat 3 --planner --loader
    .venv/bin/python bench/scale_manifest.py --daemon --sizes 10000 100000   # a real ferry serve's RSS
    .venv/bin/python bench/scale_manifest.py --engine-steps --sizes 100000   # planning a new version, step by step
    .venv/bin/python bench/scale_manifest.py --new-version --sizes 1000000   # a real ferry serve planning it
    .venv/bin/python bench/scale_manifest.py --new-version --sizes 1000000 --keep /tmp/v1m   # fixture kept, reused

Prints one JSON document on stdout: ``{"results": [ {per size}, ... ]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000)
RAW_BYTES = 128 * 2**20  # the default target shard size
STORED_RATIO = 0.786  # zstd-1 on uint16 token streams, measured
TOKENS_PER_SHARD = RAW_BYTES // 2  # uint16 ids
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def hex_strings(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random 32-hex-digit strings as a numpy ``S32`` array (vectorised, no Python loop)."""
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    out = np.empty((n, 32), dtype=np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 0x0F]
    return out.view("S32").reshape(n)


def synthetic_table(n: int, seed: int = 0) -> pa.Table:
    """An Arrow shard table of ``n`` rows shaped like a real 128 MiB-per-shard dataset."""
    rng = np.random.default_rng(seed)
    raw_hex = hex_strings(n, rng)
    stored_hex = hex_strings(n, rng)
    tokens = rng.integers(TOKENS_PER_SHARD * 9 // 10, TOKENS_PER_SHARD + 1, size=n, dtype=np.int64)
    raw_bytes = tokens * 2 + rng.integers(4_000, 40_000, size=n, dtype=np.int64)  # + Arrow offsets/framing
    stored = (raw_bytes * STORED_RATIO).astype(np.int64)
    documents = tokens // rng.integers(400, 900, size=n, dtype=np.int64)
    raw_str = np.char.decode(raw_hex, "ascii")
    paths = np.char.add(np.char.add("shards/", raw_str), ".arrow.zst")
    return pa.table(
        {
            "path": pa.array(paths, type=pa.string()),
            "documents": pa.array(documents),
            "tokens": pa.array(tokens),
            "stored_bytes": pa.array(stored),
            "raw_bytes": pa.array(raw_bytes),
            "stored_digest": pa.array(np.char.add("xxh128:", np.char.decode(stored_hex, "ascii")), type=pa.string()),
            "raw_digest": pa.array(np.char.add("xxh128:", raw_str), type=pa.string()),
        }
    )


def publish_synthetic(root: str, n: int, seed: int = 0) -> dict[str, Any]:
    """Build and publish a synthetic manifest of ``n`` shards at ``root``; returns timings and sizes."""
    from ferry.shard_tools.format.manifest import Manifest, ShardTable, Tokenizer
    from ferry.shard_tools.storage.publish import publish_version
    from ferry.shard_tools.storage.store import resolve

    t0 = time.perf_counter()
    table = ShardTable(synthetic_table(n, seed))
    t1 = time.perf_counter()
    manifest, table_data = Manifest.build(
        name=f"synthetic-{n}",
        token_dtype="uint16",
        tokenizer=Tokenizer("synthetic", 50_257, 50_256),
        eos_appended=True,
        shards=table,
        parent=None,
        created_at="2026-11-30T00:00:00Z",
        tool_version="bench",
    )
    t2 = time.perf_counter()
    loc = resolve(root)
    publish_version(loc, manifest, table_data, expect_current=None)
    t3 = time.perf_counter()
    return {
        "synthesise_s": t1 - t0,
        "build_s": t2 - t1,
        "publish_s": t3 - t2,
        "manifest_json_bytes": os.path.getsize(os.path.join(root, "manifest.json")),
        "shard_table_bytes": len(table_data),
        "version_id": manifest.version_id,
        "total_tokens": int(table.tokens.sum()),
        "total_stored_bytes": int(table.stored_bytes.sum()),
    }


def _median_time(fn: Any, repeat: int) -> tuple[float, Any]:
    times = []
    value = None
    for _ in range(repeat):
        value = None  # the last result freed first, so a peak RSS counts one of them
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def measure_one(n: int, repeat: int, planner: bool, loader: bool) -> dict[str, Any]:
    """Everything for one size, in this process (the parent runs each size in a fresh child)."""
    from ferry.shard_tools.dataset import load_manifest
    from ferry.shard_tools.storage.store import resolve

    out: dict[str, Any] = {"shards": n}
    with tempfile.TemporaryDirectory(prefix="ferry-scale-") as root:
        # Synthesis runs in its own process so its memory does not count in this one's peak RSS.
        cmd = [sys.executable, os.path.abspath(__file__), "--publish-only", root, "--sizes", str(n)]
        made = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out.update(json.loads(made.stdout.strip().splitlines()[-1]))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        loc = resolve(root)
        out["load_manifest_s"], manifest = _median_time(lambda: load_manifest(loc), repeat)
        out["peak_rss_before_load_mib"] = rss_before / 1024
        out["peak_rss_after_load_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        shards = manifest.shards

        # Locating: the first call pays the cumulative sum (cached after), then lookups are O(log n).
        t0 = time.perf_counter()
        offsets = shards.token_offsets
        out["token_offsets_s"] = time.perf_counter() - t0
        rng = np.random.default_rng(1)
        total = int(offsets[-1])
        one = int(rng.integers(0, total))
        t0 = time.perf_counter()
        shard = int(np.searchsorted(offsets, one, side="right")) - 1
        out["locate_one_s"] = time.perf_counter() - t0
        assert offsets[shard] <= one < offsets[shard + 1]
        many = rng.integers(0, total, size=100_000)
        t0 = time.perf_counter()
        idx = np.searchsorted(offsets, many, side="right") - 1
        out["locate_100k_samples_s"] = time.perf_counter() - t0
        assert bool(np.all(offsets[idx] <= many)) and bool(np.all(many < offsets[idx + 1]))
        t0 = time.perf_counter()
        info = shards[shard]
        out["first_row_access_s"] = time.perf_counter() - t0  # may build Python path/digest lists once
        assert info.path.startswith("shards/")
        out["peak_rss_after_row_access_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        if planner:
            out["planner"] = _measure_planner(root, manifest, repeat)
        if loader:
            out["loader"] = _measure_loader(root, repeat)
    return out


def _measure_planner(root: str, manifest: Any, repeat: int) -> dict[str, Any]:
    """Time ``ferry.service.replication.planner.plan_sync`` against an empty, a half-full and a complete destination,
    and the ``SourceVersion.of(manifest)`` conversion the engine does before planning."""
    try:
        from ferry.service.replication.planner import SourceVersion, plan_sync
    except ImportError as exc:
        return {"skipped": f"ferry.service.replication.planner not importable ({exc})"}
    out: dict[str, Any] = {}
    out["source_version_of_s"], src = _median_time(lambda: SourceVersion.of(manifest), repeat)
    paths = [s.path for s in src.shards]
    half = {s.path: s.size for s in src.shards[: len(src.shards) // 2]}
    full = {s.path: s.size for s in src.shards}
    cases = {
        "empty_destination": {"listing": {}, "verified": ()},
        "half_copied": {"listing": half, "verified": list(half)},
        "all_copied_unpublished": {"listing": full, "verified": paths},
    }
    for name, kw in cases.items():
        t, plan = _median_time(
            lambda kw=kw: plan_sync(src, source="east", dest_version=None, priority={"east": 1}, **kw), repeat
        )
        out[f"plan_{name}_s"] = t
        out[f"plan_{name}_copies"] = len(plan.copies)
    t, plan = _median_time(lambda: plan_sync(src, source="east", dest_version=src.version_id, listing=None), repeat)
    out["plan_up_to_date_s"] = t
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _measure_loader(root: str, repeat: int) -> dict[str, Any]:
    """Start-up of one rank (8 ranks × 16 samples of 2048 tokens): ``TokenDataset`` (manifest load,
    sample order), ``TokenLoader``, resume at 90% of the epoch, and locating the shards of the
    first batch — everything before the first shard download, which needs no real shards."""
    try:
        from ferry.client import TokenDataset, TokenLoader
        from ferry.client.sampling.partition import rank_positions
    except ImportError as exc:
        return {"skipped": f"client.TokenDataset not importable ({exc})"}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ferry-scale-cache-") as cache:
        for mode in ("global", "window"):

            def start_up(mode: str = mode, resume: bool = False) -> Any:
                ds = TokenDataset(root, seq_len=2048, seed=1234, shuffle=mode, cache_dir=cache)
                loader = TokenLoader(ds, batch_size=16, num_workers=0, rank=3, world_size=8)
                position = 0
                if resume:
                    state = loader.state_dict()
                    state["consumed"] = position = int(0.9 * ds.num_samples)
                    loader.load_state_dict(state)
                shards = ds.shards_of(rank_positions(position, 0, 16, 8, 3))
                return ds.num_samples, len(shards)

            t_fresh, (samples, _) = _median_time(start_up, repeat)
            t_resume, _ = _median_time(lambda mode=mode: start_up(mode, True), repeat)
            out[mode] = {"start_up_s": t_fresh, "resume_at_90pct_s": t_resume, "samples": samples}
        out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def publish_next(root: str, added: int, seed: int = 1) -> dict[str, Any]:
    """Publish at ``root`` a child of its current version: the same shards and ``added`` new ones (sparse
    files of the right size at ``root``)."""
    from ferry.shard_tools.dataset import load_manifest
    from ferry.shard_tools.format.manifest import Manifest, ShardTable
    from ferry.shard_tools.storage.publish import publish_version
    from ferry.shard_tools.storage.store import resolve

    loc = resolve(root)
    parent = load_manifest(loc)
    new = ShardTable(synthetic_table(added, seed))
    _sparse(root, new.paths, new.stored_bytes.tolist())  # the new shards are at the source
    shards = parent.shards.concat(new)
    manifest, table_data = Manifest.build(
        name=parent.name,
        token_dtype=parent.token_dtype,
        tokenizer=parent.tokenizer,
        eos_appended=parent.eos_appended,
        shards=shards,
        parent=parent.version_id,
        created_at="2026-11-30T00:00:01Z",
        tool_version="bench",
        lineage=parent.child_lineage(),
    )
    publish_version(loc, manifest, table_data, expect_current=parent.version_id)
    return {"version_id": manifest.version_id}


def _sparse(root: str, paths: Any, sizes: Any) -> None:
    """Files of the right size and no data at ``root``/path (what a listing or a HEAD sees)."""
    os.makedirs(os.path.join(root, "shards"), exist_ok=True)
    for path, size in zip(paths, sizes, strict=True):
        with open(os.path.join(root, path), "wb") as f:
            f.truncate(size)


def _copy_manifests(src: str, dst: str) -> None:
    """``dst`` publishes what ``src`` does: its manifest.json, versions/ and tables/ (no shards)."""
    import shutil

    os.makedirs(dst, exist_ok=True)
    for rel in ("manifest.json", "versions", "tables"):
        path = os.path.join(src, rel)
        (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join(dst, rel))


def _record_verified(state_dir: str, dataset: str, cluster: str, paths: list[str]) -> float:
    """Record ``paths`` verified at ``cluster`` in a daemon's state (what its earlier passes left); seconds."""
    from ferry.service.replication.state import State

    t0 = time.perf_counter()
    state = State(state_dir)
    state.add_verified(dataset, cluster, paths)
    state.close()
    return time.perf_counter() - t0


def measure_engine_steps(n: int, new_share: float, keep: str | None = None) -> dict[str, Any]:
    """The planning steps of one ``Engine.sync_pass`` for a new version, timed one by one, in-process: west
    publishes and has verified a version of ``n`` shards; the source's new version adds ``new_share`` of
    that in new shards (missing at west; the others are sparse files there). Also the cost of recording
    ``n`` verified shards at once (when the fixture is built). ``keep``: as for ``measure_new_version``."""
    import shutil

    import numpy as np

    from ferry.service.replication import engine as eng
    from ferry.service.replication.planner import SourceColumns, plan_columns
    from ferry.service.replication.state import State
    from ferry.shard_tools.storage.store import resolve

    with contextlib.ExitStack() as stack:
        root = keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="ferry-scale-engine-"))
        out: dict[str, Any] = dict(_new_version_fixture(root, n, new_share))
        east, west = os.path.join(root, "east", "corpus"), os.path.join(root, "west", "corpus")
        shutil.rmtree(os.path.join(root, "state-steps"), ignore_errors=True)
        shutil.copytree(os.path.join(root, "state-pristine"), os.path.join(root, "state-steps"))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        src, dst = resolve(east), resolve(west)
        state = State(os.path.join(root, "state-steps"))
        out["load_average"] = os.getloadavg()[0]
        t_all = time.perf_counter()
        header = eng.read_header(src)
        assert header is not None
        out["load_version_s"], manifest = _median_time(lambda: eng.load_version(src, header[0]), 1)
        manifest = (
            manifest[0] if isinstance(manifest, tuple) else manifest
        )  # a checkout whose load_version gives (version, table)
        out["columns_s"], cols = _median_time(lambda: SourceColumns.of(manifest), 1)
        out["verified_set_s"], known = _median_time(lambda: state.verified_paths("corpus", "west"), 1)
        out["verified_mask_s"], verified = _median_time(lambda known=known: cols.has(known), 1)
        engine = eng.Engine(eng.Executor(), state)
        out["held_s"], held = _median_time(lambda: engine._held(dst, cols, verified, "v1"), 1)
        out["held_by"] = "listing" if held.ages is not None else "lookups"
        out["plan_s"], plan = _median_time(
            lambda: plan_columns(cols, dest_version=None, held_sizes=held.sizes, verified=verified), 1
        )
        out["work_s"], work = _median_time(
            lambda: eng._Work.of(plan, cols, set(), eng._unreplaceable(plan, cols, dst)), 1
        )
        out["planned_total_s"] = time.perf_counter() - t_all
        del known
        out["arrow_mib_held"] = pa.total_allocated_bytes() / 2**20  # the planned pass's columns, in Arrow's pool
        out["copies"], out["verified"] = int(len(work.rows)), int(len(plan.verified_rows))
        assert out["copies"] == out["new_shards"] and bool(np.all(held.sizes[plan.copy_rows] == -1)), out
        out["peak_rss_before_plan_mib"] = rss0 / 1024
        out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        state.close()
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _proc_status(pid: int) -> dict[str, float]:
    """VmRSS / VmHWM of a process, in MiB (Linux)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _replicas(port: int) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/replicas", timeout=5) as resp:
        return list(json.loads(resp.read())["cells"])


def _serve(root: str, name: str) -> tuple[subprocess.Popen[bytes], int]:
    """``ferry serve`` replicating ``root``/east → ``root``/west with state in ``root``/state-``name``; a 1 B/s
    bandwidth limit keeps the first transfers waiting, so the daemon holds a planned pass."""
    port = _free_port()
    cfg = os.path.join(root, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write(
            f'state_dir = "{root}/state-{name}"\npoll_interval = 5\n'
            f'[clusters.east]\nurl = "{root}/east"\n[clusters.west]\nurl = "{root}/west"\n'
            '[[rules]]\ndatasets = "*"\nfrom = "east"\nto = ["west"]\n'
            "[limits]\ntransfers = 2\nbwlimit = 1\n"
            f'[api]\nhost = "127.0.0.1"\nport = {port}\n'
        )
    cmd = [sys.executable, "-m", "ferry.shard_tools.cli", "serve", "--config", cfg, "--log-level", "warning"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port


def _until(name: str, root: str, state: str, timeout: float) -> dict[str, Any]:
    """Start a daemon, wait until the API shows west in ``state``; that time and its RSS 2 s later."""
    proc, port = _serve(root, name)
    try:
        t0 = time.perf_counter()
        while True:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"west never reached {state!r} in {timeout}s")
            if proc.poll() is not None:
                raise RuntimeError(f"ferry serve exited with {proc.returncode}")
            try:
                cells = _replicas(port)
            except OSError:
                cells = []
            if any(c["cluster"] == "west" and c["state"] == state for c in cells):
                break
            time.sleep(0.2)
        took = time.perf_counter() - t0
        time.sleep(2.0)
        return {"seconds": took, "rss": _proc_status(proc.pid)}
    finally:
        proc.kill()
        proc.wait()


def measure_daemon(n: int, timeout: float = 300.0) -> dict[str, Any]:
    """A real ``ferry serve`` with an ``n``-shard dataset to replicate east → west.

    The shards at east are sparse files of the right size (no data), west is empty: the daemon holds
    a fully planned pass of ``n`` pending shards. Reports the time until the API shows west syncing
    and the daemon's RSS; then a second daemon against a west that already publishes the version
    (the steady state: two manifest headers per poll).
    """
    import shutil

    from ferry.shard_tools.dataset import load_manifest
    from ferry.shard_tools.storage.store import resolve

    out: dict[str, Any] = {"shards": n}
    with tempfile.TemporaryDirectory(prefix="ferry-scale-daemon-") as root:
        ds = os.path.join(root, "east", "corpus")
        info = publish_synthetic(ds, n)
        t0 = time.perf_counter()
        manifest = load_manifest(resolve(ds))
        _sparse(ds, manifest.shards.paths, manifest.shards.stored_bytes.tolist())
        out["sparse_files_s"] = time.perf_counter() - t0
        del manifest
        os.makedirs(os.path.join(root, "west"))
        planned = _until("planning", root, "syncing", timeout)
        out["start_to_planned_s"], out["planned_pass_rss"] = planned["seconds"], planned["rss"]
        west = os.path.join(root, "west", "corpus")
        shutil.rmtree(west, ignore_errors=True)
        _copy_manifests(ds, west)  # the steady state: west already publishes the version
        steady = _until("steady", root, "complete", timeout)
        out["start_to_complete_s"], out["steady_rss"] = steady["seconds"], steady["rss"]
        out["shard_table_bytes"] = info["shard_table_bytes"]
    return out


#: what issue 26 asks of a daemon planning a new 1M-shard version (start → planned; RSS held, and its peak)
TARGET_SECONDS = 2.0
TARGET_RSS_MIB = 300.0


def _new_version_fixture(root: str, n: int, new_share: float) -> dict[str, Any]:
    """At ``root``: east publishes a version of ``n`` shards and then a child adding ``new_share`` of that; west
    publishes and holds (sparse files) the first, and a daemon's state (``state-pristine``) has it verified.
    Built once: a ``ready.json`` there says it is complete, with what building it took."""
    ready = os.path.join(root, "ready.json")
    if os.path.exists(ready):
        with open(ready) as f:
            made: dict[str, Any] = json.load(f)
        if (made["shards"], made["new_shards"]) == (n, int(n * new_share)):
            return made
        raise SystemExit(f"{root} holds a fixture of {made['shards']} shards: use another --keep folder")
    from ferry.shard_tools.dataset import load_manifest
    from ferry.shard_tools.storage.store import resolve

    made = {"shards": n, "new_shards": int(n * new_share)}
    east, west = os.path.join(root, "east", "corpus"), os.path.join(root, "west", "corpus")
    publish_synthetic(east, n)
    _copy_manifests(east, west)
    t0 = time.perf_counter()
    v1 = load_manifest(resolve(east))
    _sparse(west, v1.shards.paths, v1.shards.stored_bytes.tolist())
    made["sparse_files_s"] = time.perf_counter() - t0
    made["record_verified_s"] = _record_verified(
        os.path.join(root, "state-pristine"), "corpus", "west", v1.shards.paths
    )
    del v1
    publish_next(east, made["new_shards"])
    with open(ready, "w") as f:
        json.dump(made, f)
    return made


def measure_new_version(n: int, new_share: float, keep: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """A real ``ferry serve`` planning a new version: west publishes, holds (sparse files) and has verified
    (in the daemon's state) a version of ``n`` shards; east's new version adds ``new_share`` of that in new
    shards. Reports the time until the API shows west syncing and the daemon's RSS then (``VmRSS``) and its
    peak so far (``VmHWM``). ``keep``: build that fixture in this folder once and reuse it (each run starts
    from a copy of the state it was built with), instead of a temp folder per run."""
    import shutil

    with contextlib.ExitStack() as stack:
        root = keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="ferry-scale-version-"))
        out: dict[str, Any] = dict(_new_version_fixture(root, n, new_share))
        state = os.path.join(root, "state-version")
        shutil.rmtree(state, ignore_errors=True)
        shutil.copytree(os.path.join(root, "state-pristine"), state)
        shards = os.path.join(root, "west", "corpus", "shards")
        for name in os.listdir(shards):  # the temp files an earlier run's transfers left
            if name.startswith("."):
                os.remove(os.path.join(shards, name))
        out["load_average"] = os.getloadavg()[0]
        planned = _until("version", root, "syncing", timeout)
        out["start_to_planned_s"], out["planned_pass_rss"] = planned["seconds"], planned["rss"]
        out["load_average_after"] = os.getloadavg()[0]
        rss = planned["rss"]
        out["within_targets"] = {
            "seconds": planned["seconds"] <= TARGET_SECONDS,
            "rss": rss["VmRSS"] <= TARGET_RSS_MIB,
            "peak_rss": rss["VmHWM"] <= TARGET_RSS_MIB,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    ap.add_argument("--repeat", type=int, default=3, help="median of this many loads per size")
    ap.add_argument("--planner", action="store_true", help="also time the replication planner")
    ap.add_argument("--loader", action="store_true", help="also time TokenDataset start-up")
    ap.add_argument("--daemon", action="store_true", help="measure a real ferry serve instead (e.g. --sizes 100000)")
    ap.add_argument("--engine-steps", action="store_true", help="time the planning of a new version, step by step")
    ap.add_argument("--new-version", action="store_true", help="a real ferry serve planning a new version")
    ap.add_argument("--new-share", type=float, default=0.01, help="new shards per shard of the version before")
    ap.add_argument(
        "--keep", metavar="DIR", help="--new-version, --engine-steps: build the fixture in DIR once, reuse it after"
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode: one size, this process
    ap.add_argument("--publish-only", metavar="ROOT", help=argparse.SUPPRESS)  # child mode: synthesise + publish
    args = ap.parse_args(argv)
    if args.engine_steps:
        if args.keep and len(args.sizes) > 1:
            ap.error("--keep holds the fixture of one size")
        steps = [measure_engine_steps(n, args.new_share, args.keep) for n in args.sizes]
        print(json.dumps({"engine_steps": steps}, indent=1))
        return 0
    if args.new_version:
        if args.keep and len(args.sizes) > 1:
            ap.error("--keep holds the fixture of one size")
        runs = [measure_new_version(n, args.new_share, args.keep) for n in args.sizes]
        print(json.dumps({"new_version": runs}, indent=1))
        return 0
    if args.daemon:
        print(json.dumps({"daemon": [measure_daemon(n) for n in args.sizes]}, indent=1))
        return 0
    if args.publish_only:
        (n,) = args.sizes
        print(json.dumps(publish_synthetic(args.publish_only, n)))
        return 0
    if args.one:
        (n,) = args.sizes
        print(json.dumps(measure_one(n, args.repeat, args.planner, args.loader)))
        return 0
    results = []
    for n in args.sizes:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", "--sizes", str(n), "--repeat", str(args.repeat)]
        cmd += ["--planner"] if args.planner else []
        cmd += ["--loader"] if args.loader else []
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            results.append({"shards": n, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{n} shards done", file=sys.stderr)
    print(json.dumps({"results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
