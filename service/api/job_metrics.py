"""Prometheus series per training job, with a bounded number of label values.

Series are labelled ``training_job`` (Prometheus keeps ``job`` for the scrape job): the ranks of a job add
up into one series. At most ``MAX_JOB_SERIES`` jobs get series of their own (those waiting most on data
first, then by name); the others add up under ``training_job="_other"``, so a cluster running thousands
of jobs still exports a bounded number of series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ferry.client.service.job_types import Job

__all__ = ["JobCollector", "MAX_JOB_SERIES", "OTHER"]

MAX_JOB_SERIES = 50
OTHER = "_other"  # not a valid job name (names start with a letter or digit): it never collides


@dataclass
class _Agg:
    ranks: int = 0
    stall_s: float = 0.0
    wall_s: float = 0.0
    rate: float = 0.0
    position: int | None = None
    missing: int | None = None  # bytes it reads within the staging horizon not staged yet (None: no staging)
    staged: int | None = None


def _aggregate(jobs: list[Job], missing: Callable[[str], int | None]) -> dict[str, _Agg]:
    by_name: dict[str, _Agg] = {}
    for j in jobs:
        a = by_name.setdefault(j.name, _Agg())
        a.ranks += 1
        a.stall_s += j.stats.stall_s
        a.wall_s += j.stats.wall_s
        a.rate = max(a.rate, j.samples_per_second)  # every rank reports the global rate
        a.position = j.position if a.position is None else min(a.position, j.position)
        gap = missing(j.id)
        if gap is not None:
            a.missing = max(a.missing or 0, gap)
        if j.staged_ahead_bytes is not None:
            a.staged = j.staged_ahead_bytes if a.staged is None else min(a.staged, j.staged_ahead_bytes)
    return _bounded(by_name)


def _bounded(by_name: dict[str, _Agg]) -> dict[str, _Agg]:
    """At most MAX_JOB_SERIES names plus OTHER: the jobs waiting most on data keep their own series."""
    if len(by_name) <= MAX_JOB_SERIES:
        return by_name
    ranked = sorted(by_name.items(), key=lambda kv: (-(kv[1].stall_s / kv[1].wall_s if kv[1].wall_s else 0), kv[0]))
    out = dict(ranked[:MAX_JOB_SERIES])
    other = _Agg()
    for _, a in ranked[MAX_JOB_SERIES:]:
        other.ranks += a.ranks
        other.stall_s += a.stall_s
        other.wall_s += a.wall_s
        other.rate += a.rate
        if a.missing is not None:
            other.missing = max(other.missing or 0, a.missing)
    out[OTHER] = other
    return out


class JobCollector(Collector):
    """Reads the registry at scrape time. ``jobs()`` lists the live jobs, ``missing(id)`` the bytes a job reads
    soon that staging has not placed yet (None where nothing is staged)."""

    def __init__(self, jobs: Callable[[], list[Job]], missing: Callable[[str], int | None]) -> None:
        self._jobs, self._missing = jobs, missing

    def collect(self) -> Iterator[Metric]:
        jobs = self._jobs()
        yield GaugeMetricFamily("ferry_jobs", "Registered loaders (one per rank of a training job)", value=len(jobs))
        agg = _aggregate(jobs, self._missing)
        label = ["training_job"]
        ranks = GaugeMetricFamily("ferry_job_ranks", "Registered ranks of the job", labels=label)
        stall = CounterMetricFamily("ferry_job_stall_seconds", "Time its loaders waited on data", labels=label)
        wall = CounterMetricFamily("ferry_job_wall_seconds", "Time its loaders were iterated", labels=label)
        rate = GaugeMetricFamily("ferry_job_samples_per_second", "Global samples consumed per second", labels=label)
        pos = GaugeMetricFamily("ferry_job_position", "Global samples delivered (slowest rank)", labels=label)
        behind = GaugeMetricFamily(
            "ferry_job_staging_missing_bytes",
            "Bytes the job reads within the staging horizon that are not staged yet",
            labels=label,
        )
        staged = GaugeMetricFamily("ferry_job_staged_ahead_bytes", "Bytes staged ahead of the job", labels=label)
        for name, a in sorted(agg.items()):
            ranks.add_metric([name], a.ranks)
            stall.add_metric([name], a.stall_s)
            wall.add_metric([name], a.wall_s)
            rate.add_metric([name], a.rate)
            if a.position is not None:
                pos.add_metric([name], a.position)
            if a.missing is not None:
                behind.add_metric([name], a.missing)
            if a.staged is not None:
                staged.add_metric([name], a.staged)
        yield from (ranks, stall, wall, rate, pos, behind, staged)
