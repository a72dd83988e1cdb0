"""The fleet simulator against a real local mesh: one ``ferry serve`` per destination, today's tree of whole
versions, link capacities emulated by ferry's own ``[limits.per_link]``; predicted vs measured fill time.

The mesh: four clusters (local directories) ``c0`` (origin) → ``c1``, ``c0`` → ``c2``, ``c1`` → ``c3``, one
daemon per destination (``cluster = NAME``, each preferring its rule's source), each link capped. Daemons
start with nothing to do; the dataset then appears at ``c0`` at once (a rename) and the clock starts; each
destination's time is when its ``manifest.json`` names the version. The prediction is
:func:`ferry.service.replication.simulate.simulate_tree` with the same links and the dataset's bytes.

    python bench/fleet_sim_check.py [--mib 24] [--rate 3MiB/s] [--poll 0.3] [--json]

Prints one JSON object (``--json``) or a table: per destination, predicted and measured seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from configs import Api, Cluster, FerryToml, Limits, Rule  # noqa: E402

from ferry.service.config_types import LinkSpec  # noqa: E402
from ferry.service.replication.routes import NodeCaps  # noqa: E402
from ferry.service.replication.simulate import Fleet, simulate_tree  # noqa: E402
from ferry.shard_tools.units import parse_rate  # noqa: E402

CLUSTERS = ("c0", "c1", "c2", "c3")
TREE = {"c1": "c0", "c2": "c0", "c3": "c1"}
SHARE = {"c1": 1.0, "c2": 0.5, "c3": 1.0}  # each destination's link, as a fraction of --rate


def _dataset(where: Path, mib: int) -> int:
    """A ferry dataset of ~``mib`` MiB of random tokens in 2 MiB shards; returns the bytes a copy moves."""
    import numpy as np

    from ferry.shard_tools import PackOptions, pack_documents

    doc = 65_535
    rng = np.random.default_rng(7)
    docs = (rng.integers(0, 50256, doc, dtype=np.int64) for _ in range(mib * 2**20 // (2 * (doc + 1))))
    pack_documents(docs, str(where), PackOptions(vocab_size=50257, eos_id=50256, shard_size=2 * 2**20, progress=False))
    return sum(p.stat().st_size for p in where.rglob("*") if p.is_file() and "manifest.json" not in p.name)


def _config(root: Path, me: str, rate: float, poll: float) -> Path:
    priority = {c: (1 if c == TREE[me] else 50) for c in CLUSTERS}
    return FerryToml(
        clusters={c: Cluster(root / c, priority=priority[c]) for c in CLUSTERS},
        rules=[Rule("c0", ["c1", "c2"]), Rule("c1", ["c3"])],
        limits=Limits(transfers=2, per_link={f"{TREE[d]}->{d}": rate * SHARE[d] for d in TREE}),
        api=Api(host="127.0.0.1", port=0),
        cluster=me,
        state_dir=root / f"state-{me}",
        poll_interval=poll,
    ).write(root / f"ferry-{me}.toml")


def _version(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("version_id")
    except (OSError, ValueError):
        return None


def measure(mib: int, rate: float, poll: float, timeout: float = 600) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ferry-fleet-sim-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for c in CLUSTERS:
            (root / c).mkdir()
        moved = _dataset(root / "staged", mib)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for d in TREE:
            log = (root / f"{d}.log").open("wb")
            argv = [sys.executable, "-m", "ferry.service.cli", "serve", "--config", str(_config(root, d, rate, poll))]
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(3.0)  # the daemons start and find nothing to do
        version = _version(root / "staged" / "manifest.json")
        os.rename(root / "staged", root / "c0" / "corpus")
        start, done = time.monotonic(), {}
        while len(done) < len(TREE) and time.monotonic() - start < timeout:
            for d in TREE:
                if d not in done and _version(root / d / "corpus" / "manifest.json") == version:
                    done[d] = time.monotonic() - start
            time.sleep(0.05)
        return {"bytes": moved, "measured": done, "root": str(root)}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)


def predict(moved: int, rate: float) -> dict[str, float]:
    """Each destination's predicted time: the simulator's fill of the tree down to it."""
    links = tuple(LinkSpec(TREE[d], d, rate * SHARE[d]) for d in TREE)
    out = {}
    for d in TREE:
        path = {d: TREE[d]}
        while path[next(reversed(path))] != "c0":
            last = path[next(reversed(path))]
            path[last] = TREE[last]
        fleet = Fleet(CLUSTERS, links, {c: NodeCaps() for c in CLUSTERS}, "c0")
        out[d] = simulate_tree(fleet, moved, path).fill_s
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=24)
    p.add_argument("--rate", type=parse_rate, default=parse_rate("3MiB/s"))
    p.add_argument("--poll", type=float, default=0.3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    got = measure(a.mib, a.rate, a.poll)
    want = predict(got["bytes"], a.rate)
    rows = {d: {"predicted_s": want[d], "measured_s": got["measured"].get(d)} for d in TREE}
    fill_m = max((r["measured_s"] or float("inf")) for r in rows.values())
    fill_p = max(want.values())
    out = {"bytes": got["bytes"], "rate": a.rate, "poll": a.poll, "rows": rows,
           "fill_predicted_s": fill_p, "fill_measured_s": fill_m, "error": fill_m / fill_p - 1}  # fmt: skip
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        for d, r in rows.items():
            print(f"{d}: predicted {r['predicted_s']:.2f} s, measured {r['measured_s']}")
        print(f"fill: predicted {fill_p:.2f} s, measured {fill_m:.2f} s ({out['error']:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
