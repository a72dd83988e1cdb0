"""Ray sync: the daemon's copies as Ray tasks, one node against two, each node capped like one NIC.

A real Ray cluster of separate node processes on this machine (tests/ray_cluster.py): first the head
alone, then with a second node. Every node's copies together are held to ``[transfer] node_bwlimit``
(ferry's own per-node limit standing in for a NIC), so the sync's time says how well the copies
spread over the nodes: two nodes should come close to twice one. Timed from the daemon's start to
the version published at the destination (local disk to local disk), after one untimed warm-up
sync (Ray starts its worker processes then).

    .venv/bin/python bench/suite_ray_sync.py [--mib 64] [--node-mib-s 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the Ray cluster of the tests

from ray_cluster import RayCluster  # noqa: E402

__all__ = ["run"]

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


def _sync(root: Path, dest: str, address: str, node_bps: float, version: str) -> dict[str, Any]:
    from ferry.service.config import parse_config
    from ferry.service.daemon import Daemon

    doc = {
        "clusters": {"src": {"url": str(root / "src")}, dest: {"url": str(root / dest)}},
        "rules": [{"from": "src", "to": [dest]}],
        "limits": {"transfers": TRANSFERS},
        "transfer": {"engine": "ray", "address": address, "task_cpus": TASK_CPUS, "node_bwlimit": node_bps},
        "state_dir": str(root / f"state-{dest}"),
        "poll_interval": 0.1,
    }
    d = Daemon(parse_config(doc))
    copier: Any = d.executor.copier
    t0 = time.perf_counter()
    d.start()
    try:
        while not any(r.published_version == version for r in d.replica_matrix() if r.role == "destination"):
            if time.perf_counter() - t0 > 600:
                raise TimeoutError("the sync did not publish within 600 s")
            time.sleep(0.02)
        seconds = time.perf_counter() - t0
        nodes = copier.transfers_by_node()
    finally:
        d.stop()
    return {"seconds": seconds, "copies_by_node": sorted(nodes.values())}


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
    out: dict[str, Any] = {"mib": mib, "node_mib_s": node_mib_s, "shard_mib": SHARD_MIB, "transfers": TRANSFERS}
    try:
        version, stored = _dataset(root, mib)
        out["stored_bytes"] = stored
        node_bps = node_mib_s * 2**20
        for nodes in (1, 2):
            cluster.add_node(cpus=2, resources={f"node{nodes}": 1} if nodes > 1 else None)
            _sync(root, f"warm{nodes}", cluster.address, node_bps, version)
            runs = [_sync(root, f"n{nodes}r{i}", cluster.address, node_bps, version) for i in range(repeats)]
            best = min(r["seconds"] for r in runs)
            out[f"nodes_{nodes}"] = {"runs": runs, "best_s": best, "mib_s": stored / 2**20 / best}
        out["speedup"] = out["nodes_2"]["mib_s"] / out["nodes_1"]["mib_s"]
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


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
