"""Ray sync: the daemon's copies as Ray tasks, one node against two, each node capped like one NIC.

A real Ray cluster of separate node processes on this machine (tests/ray_cluster.py): first the head
alone, then with a second node. Every node's copies together are held to ``[transfer] node_bwlimit``
(ferry's own per-node limit standing in for a NIC), so the sync's time says how well the copies
spread over the nodes: two nodes should come close to twice one. Timed from the daemon's start to
the version published at the destination (local disk to local disk): the daemon's own pass
(``Engine.sync_pass``) on one long-lived Ray driver, as in the daemon, after one untimed warm-up
pass (Ray starts the driver's worker processes on every node then).

    .venv/bin/python bench/suite_ray_sync.py [--mib 64] [--node-mib-s 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the Ray cluster of the tests

from ray_cluster import RayCluster  # noqa: E402

__all__ = ["headline_rows", "run", "section"]

SHARD_MIB = 4
TRANSFERS = 8
TASK_CPUS = 0.5  # 4 copies at a time on a node of 2 CPUs


def _dataset(root: Path, mib: int) -> tuple[str, int]:
    import numpy as np

    from ferry.shard_tools import PackOptions, open_dataset, pack_documents

    path = root / "src" / "ds"
    doc = 65_535
    rng = np.random.default_rng(5)
    docs = (rng.integers(0, 50256, doc, dtype=np.int64) for _ in range(mib * 2**20 // (2 * (doc + 1))))
    pack_documents(docs, str(path), PackOptions(vocab_size=50257, eos_id=50256, shard_size=SHARD_MIB * 2**20,
                                                progress=False))  # fmt: skip
    m = open_dataset(str(path)).manifest
    return m.version_id, int(m.shards.stored_bytes.sum())


def _engine(address: str, node_bps: float) -> Any:
    """A replication engine whose copies run on the Ray cluster: what the daemon runs, less its loop."""
    from ferry.service.replication.engine import Engine
    from ferry.service.replication.state import State
    from ferry.service.transfer.bandwidth import Bandwidth
    from ferry.service.transfer.executor import Executor
    from ferry.service.transfer.ray_copier import RayCopier

    bandwidth = Bandwidth(node_rate=node_bps)
    copier = RayCopier(bandwidth, address=address, task_cpus=TASK_CPUS)
    return Engine(Executor(transfers=TRANSFERS, bandwidth=bandwidth, copier=copier), State(None))


def _sync(engine: Any, root: Path, dest: str) -> dict[str, Any]:
    """One pass of ``ds`` from src to ``dest``, timed from its start to its publish."""
    from ferry.shard_tools.storage.store import resolve

    locations = {"src": resolve(str(root / "src" / "ds")), dest: resolve(str(root / dest / "ds"))}
    before = engine.executor.copier.transfers_by_node()
    t0 = time.perf_counter()
    result = engine.sync_pass("ds", "src", dest, locations)
    seconds = time.perf_counter() - t0
    if not result.published:
        raise RuntimeError(f"the pass to {dest} did not publish: {result.failed[:3]}")
    after = engine.executor.copier.transfers_by_node()
    return {"seconds": seconds, "copies_by_node": sorted(n - before.get(node, 0) for node, n in after.items())}


def run(
    ctx: Any = None, *, mib: int | None = None, node_mib_s: float = 8, repeats: int | None = None
) -> dict[str, Any]:
    """One node, then two (``ctx``: bench/run.py's Context, for its repeats and --quick)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"error": "Ray is not installed (pip install 'ferry-data[ray]')"}
    quick = bool(ctx is not None and ctx.quick)
    mib = mib or (32 if quick else 64)
    repeats = repeats or (ctx.repeats if ctx is not None else 2)
    root = Path(tempfile.mkdtemp(prefix="ferry-ray-bench-"))
    cluster = RayCluster()
    os.environ["RAY_AUTH_MODE"] = cluster.env["RAY_AUTH_MODE"]  # the daemon's driver, as the nodes
    out: dict[str, Any] = {"mib": mib, "node_mib_s": node_mib_s, "shard_mib": SHARD_MIB, "transfers": TRANSFERS}
    try:
        _, stored = _dataset(root, mib)
        out["stored_bytes"] = stored
        node_bps = node_mib_s * 2**20
        for nodes in (1, 2):
            cluster.add_node(cpus=2, resources={f"node{nodes}": 1} if nodes > 1 else None)
            engine = _engine(cluster.address, node_bps)
            try:
                _sync(engine, root, f"warm{nodes}")  # Ray starts this driver's workers on every node
                runs = [_sync(engine, root, f"n{nodes}r{i}") for i in range(repeats)]
            finally:
                engine.executor.shutdown()
            best = min(r["seconds"] for r in runs)
            out[f"nodes_{nodes}"] = {"runs": runs, "best_s": best, "mib_s": stored / 2**20 / best}
        out["speedup"] = out["nodes_2"]["mib_s"] / out["nodes_1"]["mib_s"]
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def section(res: dict[str, Any] | None) -> list[str]:
    """The Ray sync section of docs/BENCHMARKS.md."""
    if not res:
        return []
    lines = ["## Replication on Ray: one node against two", ""]
    if "error" in res:
        return [*lines, str(res["error"]), ""]
    lines += [
        f"`bench/suite_ray_sync.py`: {res['stored_bytes'] / 2**20:.0f} MiB in {res['shard_mib']} MiB shards, "
        f"local disk to local disk, {res['transfers']} copies in flight, every node's copies held to "
        f"{res['node_mib_s']:g} MiB/s (`[transfer] node_bwlimit`, standing in for one NIC). Nodes are "
        "processes of one Ray cluster on this machine; timed from the pass's start to its publish, best of "
        "the repeats after a warm-up pass.",
        "",
        "| nodes | best pass | MiB/s | copies per node (each run) |",
        "|---|---|---|---|",
    ]
    for nodes in (1, 2):
        got = res.get(f"nodes_{nodes}")
        if got:
            per_node = "; ".join(" + ".join(str(n) for n in r["copies_by_node"]) for r in got["runs"])
            lines.append(f"| {nodes} | {got['best_s']:.2f} s | {got['mib_s']:.1f} | {per_node} |")
    if "speedup" in res:
        lines += ["", f"Two nodes move **{res['speedup']:.2f}x** what one does (goal: at least 1.7x)."]
    return [*lines, ""]


def headline_rows(res: dict[str, Any] | None) -> list[str]:
    """Two Ray nodes against one (a ratio, no peer)."""
    if not res or "speedup" not in res:
        return []
    cap = f"{res['node_mib_s']:g} MiB/s"
    return [f"| sync MB/s on Ray, 2 nodes | 1 node (each capped to {cap}) | {res['speedup']:.2f}x |"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--node-mib-s", type=float, default=8)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    print(json.dumps(run(mib=a.mib, node_mib_s=a.node_mib_s, repeats=a.repeats), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
