"""What the loader and its fetches did, as counters that add up across processes.

Every process keeps one :data:`COUNTERS` (fetches by replica, cache hits, bytes delivered, time the
training loop waited). A DataLoader worker sends the growth of its counters since its last item along
with each item, and the main process adds them to its own: sums of counters are exact across workers,
and latencies are kept as fixed-bucket histograms so that they add up too (percentiles are read from
the merged histogram). :func:`render_prometheus` writes the text exposition format.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Any

__all__ = ["COUNTERS", "Counters", "LATENCY_BOUNDS", "merge", "subtract", "summarise", "render_prometheus"]

#: Upper bounds (seconds) of the request latency histogram's buckets (the last one is +Inf).
LATENCY_BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_REPLICA_FIELDS = ("requests", "bytes", "failed", "missing", "hedged", "timed_out", "seconds")


def _empty_replica() -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(_REPLICA_FIELDS, 0)
    out["latency"] = [0] * (len(LATENCY_BOUNDS) + 1)
    return out


class Counters:
    """Thread-safe nested counters of one process (plain dicts of numbers and lists of numbers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {"replicas": {}, "cache": {"hits": 0, "misses": 0, "shards_fetched": 0}}
        self.changes = 0  # bumped by every update: a worker whose counters did not move sends nothing

    def request(self, url: str, nbytes: int, seconds: float, outcome: str) -> None:
        """One request to a replica: ``outcome`` is ok, failed, missing or timed_out (then cancelled)."""
        slot = next((i for i, b in enumerate(LATENCY_BOUNDS) if seconds <= b), len(LATENCY_BOUNDS))
        with self._lock:
            self.changes += 1
            rep = self._data["replicas"].setdefault(url, _empty_replica())
            rep["requests"] += 1
            rep["bytes"] += nbytes
            if outcome == "ok":
                rep["seconds"] += seconds
                rep["latency"][slot] += 1
            else:
                rep[outcome] += 1

    def hedged(self, url: str) -> None:
        """A request to ``url`` passed its deadline and was sent to another replica too."""
        with self._lock:
            self.changes += 1
            self._data["replicas"].setdefault(url, _empty_replica())["hedged"] += 1

    def add(self, section: str, key: str, value: float) -> None:
        with self._lock:
            self.changes += 1
            part = self._data.setdefault(section, {})
            part[key] = part.get(key, 0) + value

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._data)

    def absorb(self, delta: dict[str, Any]) -> None:
        """Add another process's growth (a worker's delta) to these counters."""
        if not delta:
            return
        with self._lock:
            self.changes += 1
            merge(self._data, delta)


COUNTERS = Counters()


def _unlock_in_child() -> None:
    """A forked child has only the forking thread: a lock another thread held (a loader's helper thread
    absorbing a worker's counters) would stay held forever there. The child's counters get a new lock."""
    COUNTERS._lock = threading.Lock()


os.register_at_fork(after_in_child=_unlock_in_child)


def merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``into += other``, key by key (numbers add, lists add element-wise, dicts recurse)."""
    for key, value in other.items():
        mine = into.get(key)
        if isinstance(value, dict):
            into[key] = merge(mine if isinstance(mine, dict) else {}, value)
        elif isinstance(value, list):
            base = mine if isinstance(mine, list) else [0] * len(value)
            into[key] = [a + b for a, b in zip(base, value, strict=True)]
        else:
            into[key] = (mine or 0) + value
    return into


def subtract(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``now - before`` key by key (the growth between two snapshots)."""
    out: dict[str, Any] = {}
    for key, value in now.items():
        old = before.get(key)
        if isinstance(value, dict):
            out[key] = subtract(value, old if isinstance(old, dict) else {})
        elif isinstance(value, list):
            base = old if isinstance(old, list) else [0] * len(value)
            out[key] = [a - b for a, b in zip(value, base, strict=True)]
        else:
            out[key] = value - (old or 0)
    return out


def _percentile(hist: list[int], q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (None without samples; inf past the last bound)."""
    total = sum(hist)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return LATENCY_BOUNDS[i] if i < len(LATENCY_BOUNDS) else float("inf")
    return float("inf")


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    """Derived figures (shares, ratios, percentiles) beside the raw counters of ``data``."""
    loop = data.get("loop", {})
    cache = data.get("cache", {})
    replicas = {}
    downloaded = 0
    for url, rep in data.get("replicas", {}).items():
        hist = rep["latency"]
        replicas[url] = {
            **{k: rep[k] for k in _REPLICA_FIELDS},
            "latency_p50_s": _percentile(hist, 0.5),
            "latency_p90_s": _percentile(hist, 0.9),
            "latency_p99_s": _percentile(hist, 0.99),
        }
        downloaded += rep["bytes"]
    delivered = loop.get("delivered_bytes", 0)
    wall = loop.get("wall_s", 0.0)
    opens = cache.get("hits", 0) + cache.get("misses", 0)
    return {
        "stall_s": loop.get("stall_s", 0.0),
        "wall_s": wall,
        "stall_share": loop.get("stall_s", 0.0) / wall if wall else 0.0,
        "batches": loop.get("batches", 0),
        "delivered_bytes": delivered,
        "downloaded_bytes": downloaded,
        "downloaded_per_delivered": downloaded / delivered if delivered else None,
        "cache_hits": cache.get("hits", 0),
        "cache_misses": cache.get("misses", 0),
        "cache_hit_ratio": cache.get("hits", 0) / opens if opens else None,
        "shards_fetched": cache.get("shards_fetched", 0),
        "hedged": sum(r["hedged"] for r in replicas.values()),
        "failed": sum(r["failed"] + r["timed_out"] for r in replicas.values()),
        "replicas": replicas,
    }


def _label(url: str) -> str:
    return url.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render_prometheus(data: dict[str, Any], prefix: str = "ferry_loader") -> str:
    """The counters of ``data`` (a :meth:`Counters.snapshot` or ``loader.stats()["raw"]``) as Prometheus text."""
    loop, cache = data.get("loop", {}), data.get("cache", {})
    lines: list[str] = []

    def metric(name: str, kind: str, helptext: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {prefix}_{name} {helptext}")
        lines.append(f"# TYPE {prefix}_{name} {kind}")
        lines.extend(f"{prefix}_{name}{labels} {value:.17g}" for labels, value in samples)

    metric("stall_seconds_total", "counter", "Time the training loop waited on data.", [("", loop.get("stall_s", 0))])
    metric("wall_seconds_total", "counter", "Time the loader was iterated.", [("", loop.get("wall_s", 0))])
    metric("batches_total", "counter", "Batches delivered.", [("", loop.get("batches", 0))])
    metric("delivered_bytes_total", "counter", "Token bytes delivered.", [("", loop.get("delivered_bytes", 0))])
    metric("cache_hits_total", "counter", "Shard opens served by the cache.", [("", cache.get("hits", 0))])
    metric("cache_misses_total", "counter", "Shard opens that waited on a fetch.", [("", cache.get("misses", 0))])
    reps = sorted(data.get("replicas", {}).items())
    for field, helptext in (
        ("requests", "Requests sent to a replica."),
        ("bytes", "Bytes received from a replica."),
        ("failed", "Requests that failed."),
        ("missing", "Requests for an object the replica does not have."),
        ("hedged", "Requests past their deadline, sent to another replica too."),
        ("timed_out", "Requests cancelled after their deadline."),
    ):
        metric(f"fetch_{field}_total", "counter", helptext, [(f'{{replica="{_label(u)}"}}', r[field]) for u, r in reps])
    lines.append(f"# HELP {prefix}_fetch_latency_seconds Latency of successful requests.")
    lines.append(f"# TYPE {prefix}_fetch_latency_seconds histogram")
    for url, rep in reps:
        seen = 0
        for bound, n in zip([*LATENCY_BOUNDS, float("inf")], rep["latency"], strict=True):
            seen += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'{prefix}_fetch_latency_seconds_bucket{{replica="{_label(url)}",le="{le}"}} {seen}')
        ok = sum(rep["latency"])
        lines.append(f'{prefix}_fetch_latency_seconds_sum{{replica="{_label(url)}"}} {rep["seconds"]:.17g}')
        lines.append(f'{prefix}_fetch_latency_seconds_count{{replica="{_label(url)}"}} {ok}')
    return "\n".join(lines) + "\n"
