"""The shard-level swarm against today's tree of whole versions, on a real local mesh: an origin ``o`` and three
clusters ``c1..c3``, one ``ferry serve`` per destination (``cluster = NAME``), every link (``o->ci`` and
``ci->cj``) capped at ``--rate`` (``o->ci`` at a fraction of it with ``--origin-shares``) by ferry's own
``[limits.per_link]``.

Both fills run in the same invocation, one after the other, on fresh directories: ``tree`` (``[swarm]`` off:
each destination copies from the origin, or from a cluster that has published the version) and ``swarm``
(``[swarm] enabled``). For each: the fill time (the dataset appears at the origin by a rename; done when
every destination's ``manifest.json`` names the version), the bytes the origin sent (from every daemon's
transfer history, failed attempts included) per byte of the dataset, and the max-flow lower bound of the fill
computed from the caps (``routes.max_flow_rate``: the slowest destination's bytes over its max flow from the
origin).

    python bench/swarm_check.py [--mib 48] [--shard-kib 512] [--rate 8MiB/s] [--transfers 4]
        [--origin-shares 1,1,1] [--json]
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

from configs import Api, Cluster, FerryToml, Limits, Rule, toml_text  # noqa: E402

from ferry.service.config_types import LinkSpec  # noqa: E402
from ferry.service.replication.routes import max_flow_rate  # noqa: E402
from ferry.shard_tools.units import parse_rate  # noqa: E402

ORIGIN = "o"
DESTS = ("c1", "c2", "c3")
CLUSTERS = (ORIGIN, *DESTS)
DATASET = "corpus"


def _links(rate: float, shares: tuple[float, ...]) -> dict[tuple[str, str], float]:
    """Every link's cap: ``o->ci`` at ``rate`` times ``shares[i-1]``, ``ci->cj`` at ``rate``."""
    return {(a, b): rate * (shares[DESTS.index(b)] if a == ORIGIN else 1.0) for a in CLUSTERS for b in DESTS if a != b}


def _dataset(where: Path, mib: int, shard_kib: int) -> int:
    """~``mib`` MiB of random tokens in ``shard_kib`` KiB shards; returns the bytes of its shards."""
    import numpy as np

    from ferry.shard_tools import PackOptions, pack_documents

    doc = 65_535
    rng = np.random.default_rng(7)
    docs = (rng.integers(0, 50256, doc, dtype=np.int64) for _ in range(mib * 2**20 // (2 * (doc + 1))))
    opts = PackOptions(vocab_size=50257, eos_id=50256, shard_size=shard_kib * 1024, progress=False)
    pack_documents(docs, str(where), opts)
    return sum(p.stat().st_size for p in (where / "shards").rglob("*") if p.is_file())


def _config(root: Path, me: str, links: dict[tuple[str, str], float], transfers: int, swarm: bool) -> Path:
    doc = FerryToml(
        clusters={c: Cluster(root / c, priority=1 if c == ORIGIN else 5) for c in CLUSTERS},
        rules=[Rule(ORIGIN, list(DESTS))],
        limits=Limits(transfers=transfers, per_link={f"{a}->{b}": r for (a, b), r in links.items() if b == me}),
        api=Api(host="127.0.0.1", port=0),
        cluster=me,
        state_dir=root / f"state-{me}",
        poll_interval=0.2,
    ).doc()
    doc["swarm"] = {"enabled": swarm, "interval": 0.1}
    path = root / f"ferry-{me}.toml"
    path.write_text(toml_text(doc))
    return path


def _version(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("version_id")
    except (OSError, ValueError):
        return None


def _origin_bytes(root: Path) -> int:
    from ferry.service.replication.state import State

    sent = 0
    for d in DESTS:
        state = State(root / f"state-{d}")
        try:
            sent += sum(h.bytes for h in state.history(limit=10**7, dataset=DATASET) if h.source == ORIGIN)
        finally:
            state.close()
    return sent


def fill(mode: str, args: argparse.Namespace, timeout: float = 600) -> dict[str, Any]:
    """One fill of a fresh mesh; its seconds, per destination and in all, and the origin's bytes."""
    root = Path(tempfile.mkdtemp(prefix=f"ferry-swarm-{mode}-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for c in CLUSTERS:
            (root / c).mkdir()
        moved = _dataset(root / "staged", args.mib, args.shard_kib)
        shards = len(list((root / "staged" / "shards").iterdir()))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for d in DESTS:
            cfg = _config(root, d, _links(args.rate, args.origin_shares), args.transfers, mode == "swarm")
            argv = [sys.executable, "-m", "ferry.service.cli", "serve", "--config", str(cfg)]
            log = (root / f"{d}.log").open("wb")
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(3.0)  # the daemons start and find nothing to do
        version = _version(root / "staged" / "manifest.json")
        os.rename(root / "staged", root / ORIGIN / DATASET)
        start, done = time.monotonic(), {}
        while len(done) < len(DESTS) and time.monotonic() - start < timeout:
            for d in DESTS:
                if d not in done and _version(root / d / DATASET / "manifest.json") == version:
                    done[d] = time.monotonic() - start
            time.sleep(0.02)
        _stop(procs)
        left = sorted(str(p.relative_to(root)) for d in DESTS for p in (root / d / DATASET / "swarm").glob("*"))
        sent = _origin_bytes(root)
        return {"mode": mode, "bytes": moved, "shards": shards, "per_destination_s": done,
                "fill_s": max(done.values()) if len(done) == len(DESTS) else None,
                "origin_bytes": sent, "origin_sends_per_shard": sent / moved, "swarm_sets_left": left}  # fmt: skip
    finally:
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def lower_bound(moved: int, links_caps: dict[tuple[str, str], float]) -> float:
    """The max-flow bound: no plan fills the slowest destination faster than its bytes over its max flow."""
    links = [LinkSpec(a, b, r) for (a, b), r in links_caps.items()]
    return max(moved / max_flow_rate(frozenset({ORIGIN}), d, links) for d in DESTS)


def _shares(text: str) -> tuple[float, ...]:
    shares = tuple(float(x) for x in text.split(","))
    if len(shares) != len(DESTS) or min(shares) <= 0:
        raise argparse.ArgumentTypeError(f"expected {len(DESTS)} positive fractions, got {text!r}")
    return shares


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=48)
    p.add_argument("--shard-kib", type=int, default=512)
    p.add_argument("--rate", type=parse_rate, default=parse_rate("8MiB/s"))
    p.add_argument("--transfers", type=int, default=4)
    p.add_argument("--origin-shares", type=_shares, default=(1.0, 1.0, 1.0),
                   help="each link o->c1,c2,c3 as a fraction of --rate (default 1,1,1)")  # fmt: skip
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    load_before = os.getloadavg()
    runs = [fill("tree", a), fill("swarm", a)]
    bound = lower_bound(runs[0]["bytes"], _links(a.rate, a.origin_shares))
    for r in runs:
        r["lower_bound_s"] = bound
        r["bound_ratio"] = r["fill_s"] / bound if r["fill_s"] else None
    out = {"mib": a.mib, "shard_kib": a.shard_kib, "rate": a.rate, "origin_shares": a.origin_shares,
           "transfers": a.transfers, "runs": runs, "loadavg_before": load_before,
           "loadavg_after": os.getloadavg()}  # fmt: skip
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{runs[0]['shards']} shards, {runs[0]['bytes'] / 2**20:.1f} MiB; links {a.rate / 2**20:g} MiB/s, "
              f"o->c1..3 x {a.origin_shares}; max-flow bound {bound:.2f} s; "
              f"load {load_before[0]:.1f} -> {out['loadavg_after'][0]:.1f}")  # fmt: skip
        for r in runs:
            print(f"{r['mode']:>5}: fill {r['fill_s']:.2f} s ({r['bound_ratio']:.2f}x the bound), origin sent each "
                  f"shard {r['origin_sends_per_shard']:.2f}x; per destination "
                  + ", ".join(f"{d} {s:.2f}" for d, s in sorted(r["per_destination_s"].items())))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
