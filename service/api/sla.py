"""The SLA share of a link: of the versions a link had to bring, how many were published within the SLA.

A pure function of the State's version timings (``Daemon.version_timings()``): nothing is kept here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ferry.service.records import VersionTiming

__all__ = ["sla_counts"]

Link = tuple[str, str]


def sla_counts(
    timings: Iterable[VersionTiming], link_of: Mapping[tuple[str, str], Link], sla_seconds: float, now: float
) -> dict[Link, tuple[int, int]]:
    """link → (versions counted, versions published within ``sla_seconds``).

    ``link_of`` maps (dataset, destination) to its (source, destination) link. A published version
    counts; a version still pending counts (as a miss) once it has missed the SLA.
    """
    totals: dict[Link, tuple[int, int]] = {}
    for v in timings:
        link = link_of.get((v.dataset, v.cluster))
        if link is None:
            continue
        elapsed = (v.completed if v.completed is not None else now) - v.first_seen
        if v.completed is None and elapsed <= sla_seconds:
            continue
        total, within = totals.get(link, (0, 0))
        totals[link] = (total + 1, within + int(v.completed is not None and elapsed <= sla_seconds))
    return totals
