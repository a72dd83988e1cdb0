"""Prometheus exposition: a collector that reads the daemon at scrape time (no global registry)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .backend import ApiBackend

__all__ = ["render_metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _DaemonCollector(Collector):
    def __init__(self, backend: ApiBackend) -> None:
        self._backend = backend

    def collect(self) -> Iterator[Metric]:
        b = self._backend
        copied = CounterMetricFamily(
            "ferry_copied_bytes", "Verified bytes copied since start", labels=["dataset", "source", "destination"]
        )
        for (ds, src, dst), n in sorted(b.copied_bytes().items()):
            copied.add_metric([ds, src, dst], float(n))
        yield copied

        cells = b.replicas().cells
        pending_b = GaugeMetricFamily("ferry_pending_bytes", "Bytes not yet verified", labels=["dataset", "cluster"])
        pending_s = GaugeMetricFamily("ferry_pending_shards", "Shards not yet verified", labels=["dataset", "cluster"])
        verified = GaugeMetricFamily("ferry_verified_shards", "Verified shards", labels=["dataset", "cluster"])
        lag = GaugeMetricFamily(
            "ferry_lag_seconds", "Seconds since the unreplicated version appeared", labels=["dataset", "cluster"]
        )
        for c in cells:
            if c.role != "destination":
                continue
            labels = [c.dataset, c.cluster]
            pending_b.add_metric(labels, float(max(0, c.total_bytes - c.verified_bytes)))
            pending_s.add_metric(labels, float(max(0, c.total_shards - c.verified_shards)))
            verified.add_metric(labels, float(c.verified_shards))
            lag.add_metric(labels, float(c.lag_seconds or 0.0))
        yield from (pending_b, pending_s, verified, lag)

        errs = GaugeMetricFamily("ferry_errors", "Open replication errors", labels=["dataset", "cluster", "retryable"])
        counts: dict[tuple[str, str, str], int] = {}
        for e in b.errors(10_000):
            key = (e.dataset, e.cluster, "true" if e.retryable else "false")
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            errs.add_metric(list(key), float(n))
        yield errs

        st = b.status()
        yield GaugeMetricFamily("ferry_transfers_in_flight", "Shard copies in flight", value=st.transfers_in_flight)
        yield GaugeMetricFamily("ferry_rate_bytes_per_second", "Current copy rate", value=st.rate_bps)
        yield GaugeMetricFamily("ferry_paused", "1 when replication is paused", value=1.0 if st.paused else 0.0)
        yield GaugeMetricFamily("ferry_uptime_seconds", "Seconds since the daemon started", value=st.uptime_seconds)


def render_metrics(backend: ApiBackend, extra: Iterable[Collector] = ()) -> bytes:
    """Prometheus text format for the daemon's current counters (and those of the ``extra`` collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DaemonCollector(backend))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)
