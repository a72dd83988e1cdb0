"""``ApiBackend`` over the real ``ferry.service.daemon.Daemon``: records → pydantic models, events → callbacks.

It keeps no facts of its own: lag, open errors and the SLA share come from the daemon's State
(``sla``), counters from its Stats; the throughput chart's samples are ``rates``'s. Every string
that leaves here is scrubbed of configured secret values (``redaction``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, get_args

from ferry.client.service.service_types import CellState
from ferry.shard_tools.errors import ConfigError, NotFoundError, UsageError
from ferry.shard_tools.threadname import start_named_thread

from ..config import ApiConfig
from ..records import Egress
from ..replication.routes import GB
from .backend import Invalid
from .models import (
    ActionResult,
    ClusterOut,
    DatasetDetail,
    DatasetSummary,
    ErrorEntry,
    EventOut,
    HistoryEntry,
    LimitsIn,
    LimitsOut,
    LinkEgressOut,
    LinkOut,
    OtherWriterOut,
    ReplicaCell,
    ReplicaMatrix,
    RetryIn,
    ScrubIn,
    StatusOut,
    SyncIn,
    ThroughputOut,
    ThroughputPoint,
    TransferOut,
)
from .rates import ThroughputSampler
from .redaction import Redactor, secret_values
from .sla import sla_counts

__all__ = ["DaemonBackend", "secret_values"]

_PUMP_INTERVAL = 0.05  # seconds between collections of events while they keep coming
_KNOWN_STATES = set(get_args(CellState))
_OPEN_ERRORS_CAP = 10_000  # open errors counted for /status (and /metrics), read from the State like /errors


class DaemonBackend:
    """Adapts a running Daemon to the API; call ``close()`` to stop its two helper threads."""

    def __init__(self, daemon: Any, settings: ApiConfig, *, sample_interval: float = 1.0) -> None:
        self._d = daemon
        self._settings = settings
        self._redactor = Redactor(secret_values(daemon.config, settings.token))
        self._clean = self._redactor.clean
        self._subs: dict[int, Callable[[EventOut], None]] = {}
        self._next_sub = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._queue = daemon.subscribe(maxsize=10_000)
        self._sampler = ThroughputSampler(self._bytes_moved, lambda: bool(daemon.running), sample_interval)
        self._pump_thread = start_named_thread(self._pump, "ferry-api-event")

    def _bytes_moved(self) -> float:
        """Verified bytes copied plus the bytes of the copies in flight (the chart's counter)."""
        return float(self._d.stats().copied_bytes_total + sum(t.bytes_done for t in self._d.transfers()))

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the event pump and the sampler; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._d.unsubscribe(self._queue)
        self._pump_thread.join(timeout=5)
        self._sampler.close()

    def _pump(self) -> None:
        while not self._closed.is_set():
            try:
                batch = [self._queue.get(timeout=0.25)]  # idle: sleep until an event arrives
            except queue.Empty:
                continue
            while batch:
                for raw in batch:
                    self._dispatch(raw)
                # busy: collect what arrives over the next interval without being woken per event (a
                # wake-up per event, done by the copy thread publishing it, cost the sync more than
                # handling the event)
                if self._closed.wait(_PUMP_INTERVAL):
                    return
                batch = []
                with contextlib.suppress(queue.Empty):
                    while True:
                        batch.append(self._queue.get_nowait())

    def _dispatch(self, raw: dict[str, Any]) -> None:
        ev = self._event(raw)
        with self._lock:
            subs = list(self._subs.values())
        for cb in subs:
            cb(ev)

    def _event(self, raw: dict[str, Any]) -> EventOut:
        data = {k: self._clean(v) for k, v in raw.items() if k not in ("type", "ts")}
        return EventOut(kind=str(raw.get("type", "event")), time=float(raw.get("ts") or time.time()), data=data)

    # ---- read side -------------------------------------------------------------------------------------------

    def clusters(self) -> list[ClusterOut]:
        return [ClusterOut(**{**dataclasses.asdict(c), "url": self._clean(c.url)}) for c in self._d.clusters()]

    def _summary(self, info: Any) -> DatasetSummary:
        return DatasetSummary(
            name=info.name,
            source=info.source,
            destinations=list(info.destinations),
            version=info.version,
            versions=len(info.versions),
            shards=info.shards,
            bytes=info.bytes,
            tokens=info.tokens,
        )

    def datasets(self) -> list[DatasetSummary]:
        return [self._summary(d) for d in self._d.datasets()]

    def dataset(self, name: str, shard_limit: int) -> DatasetDetail:
        info = self._d.dataset(name)  # NotFoundError, naming the dataset: the API's 404
        return DatasetDetail(
            name=info.name,
            source=info.source,
            destinations=list(info.destinations),
            version=info.version,
            versions=list(info.versions),
            shards=info.shards,
            bytes=info.bytes,
            tokens=info.tokens,
            replicas=[self._cell(r, self._broken_sources()) for r in info.replicas],
        )

    def _broken_sources(self) -> set[tuple[str, str]]:
        """(dataset, cluster) where the daemon holds an open error: at a dataset's source, that is an
        unreadable manifest (or a name it refuses), and nothing is replicated from there."""
        return {(e.dataset, e.cluster) for e in self._d.errors(limit=_OPEN_ERRORS_CAP)}

    @staticmethod
    def _cell(r: Any, broken: set[tuple[str, str]]) -> ReplicaCell:
        total_b, done_b = int(r.total_bytes), int(r.verified_bytes)
        total_s, done_s = int(r.total_shards), int(r.verified_shards)
        if r.role == "source" and (r.dataset, r.cluster) in broken:
            return ReplicaCell(
                dataset=r.dataset, cluster=r.cluster, role="source", state="failed",
                published_version=None, target_version=r.target_version, verified_shards=0,
                total_shards=total_s, verified_bytes=0, total_bytes=total_b, percent=0.0, lag_seconds=None,
            )  # fmt: skip
        if total_b > 0:
            pct = 100.0 * min(done_b, total_b) / total_b
        elif total_s > 0:
            pct = 100.0 * min(done_s, total_s) / total_s
        else:
            pct = 100.0 if r.state in ("complete", "source") else 0.0
        return ReplicaCell(
            dataset=r.dataset,
            cluster=r.cluster,
            role="source" if r.role == "source" else "destination",
            state=r.state if r.state in _KNOWN_STATES else "unknown",
            published_version=r.published_version,
            target_version=r.target_version,
            verified_shards=done_s,
            total_shards=total_s,
            verified_bytes=done_b,
            total_bytes=total_b,
            percent=round(pct, 2),
            lag_seconds=r.lag_seconds,
        )

    def replicas(self) -> ReplicaMatrix:
        broken = self._broken_sources()
        cells = [self._cell(r, broken) for r in self._d.replica_matrix()]
        datasets = list(dict.fromkeys(c.dataset for c in cells))
        clusters = [c.name for c in self._d.clusters()]
        return ReplicaMatrix(datasets=datasets, clusters=clusters, cells=cells)

    def transfers(self) -> list[TransferOut]:
        return [
            TransferOut(
                **{**dataclasses.asdict(t), "source": self._clean(t.source), "destination": self._clean(t.destination)}
            )  # fmt: skip
            for t in self._d.transfers()
        ]

    def history(self, limit: int, dataset: str | None) -> list[HistoryEntry]:
        return [
            HistoryEntry(
                id=h.id,
                dataset=h.dataset,
                version=h.version,
                shard=h.shard,
                source=self._clean(h.source),
                destination=self._clean(h.destination),
                bytes=h.bytes,
                started_at=h.started_at,
                duration_s=h.duration_s,
                ok=h.ok,
                error=self._clean(h.error),
            )
            for h in self._d.history(limit=limit, dataset=dataset)
        ]

    def errors(self, limit: int) -> list[ErrorEntry]:
        return [ErrorEntry(**{**dataclasses.asdict(e), "reason": self._clean(e.reason)}) for e in self._d.errors(limit)]

    def _link_of(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(dataset, destination) → (source, destination) for every replicated dataset."""
        return {(d.name, dst): (d.source, dst) for d in self._d.datasets() for dst in d.destinations}

    def links(self) -> list[LinkOut]:
        sla_s = self._settings.sla_minutes * 60.0
        now = time.time()
        lim = self._d.limits()
        rates: dict[tuple[str, str], float] = {}
        for t in self._d.transfers():
            rates[(t.source, t.destination)] = rates.get((t.source, t.destination), 0.0) + float(t.rate_bps)
        of = self._link_of()
        lag: dict[tuple[str, str], float] = {}
        for cell in self._d.replica_matrix():
            link = of.get((cell.dataset, cell.cluster))
            if link is not None and cell.role == "destination":
                lag[link] = max(lag.get(link, 0.0), float(cell.lag_seconds or 0.0))
        totals = sla_counts(self._d.version_timings(), of, sla_s, now)
        specs = self._d.config.link_specs
        egress: dict[tuple[str, str], list[Egress]] = {}
        for e in self._d.egress():
            egress.setdefault((e.source, e.destination), []).append(e)
        # the rules' links, then any other link copies went over (a swarm peer, a nearer replica)
        planned = {k: v for k, v in self._d.planned_rates().items() if math.isfinite(v)}
        links = list(dict.fromkeys([*self._d.config.links(), *rates, *egress, *planned]))
        out = []
        for src, dst in links:
            total, within = totals.get((src, dst), (0, 0))
            spec = specs.get((src, dst))
            price = spec.price_per_gb if spec is not None else 0.0
            out.append(
                LinkOut(
                    source=src,
                    destination=dst,
                    lag_seconds=lag.get((src, dst), 0.0),
                    sla_minutes=self._settings.sla_minutes,
                    versions_total=total,
                    versions_within_sla=within,
                    share_within_sla=(within / total) if total else None,
                    limit_bps=lim.links.get(f"{src}->{dst}"),
                    rate_bps=rates.get((src, dst), 0.0),
                    capacity_bps=spec.capacity if spec is not None else None,
                    price_per_gb=price,
                    egress=[
                        LinkEgressOut(dataset=e.dataset, version=e.version, bytes=e.bytes, cost=e.bytes / GB * price)
                        for e in egress.get((src, dst), [])
                    ],
                    planned_bps=planned.get((src, dst)),
                )
            )
        return out

    def throughput(self, seconds: float, buckets: int) -> ThroughputOut:
        points = self._sampler.history.buckets(time.time(), seconds, buckets)
        return ThroughputOut(
            bucket_seconds=seconds / buckets, points=[ThroughputPoint(t=t, bps=max(0.0, v)) for t, v in points]
        )

    def limits(self) -> LimitsOut:
        lim = self._d.limits()
        return LimitsOut(transfers=lim.transfers, global_bps=lim.global_bps, links=dict(lim.links))

    def status(self) -> StatusOut:
        st = self._d.stats()
        return StatusOut(
            paused=bool(self._d.paused),
            ready=self.ready(),
            version=_ferry_version(),
            uptime_seconds=st.uptime_seconds,
            transfers_in_flight=st.transfers_in_flight,
            # the failed shards /errors lists, not the Stats counter of every failed attempt since start
            open_errors=len(self._d.errors(limit=_OPEN_ERRORS_CAP)),
            copied_bytes_total=st.copied_bytes_total,
            rate_bps=st.rate_bps,
            pending_bytes=st.pending_bytes,
            pending_shards=st.pending_shards,
            eta_seconds=st.eta_seconds,
            limits=self.limits(),
            sla_minutes=self._settings.sla_minutes,
            read_protected=self._settings.read_protected,
            other_writers=[
                OtherWriterOut(dataset=d, cluster=c, holder=h) for (d, c), h in sorted(self._d.other_writers().items())
            ],
        )

    def ready(self) -> bool:
        return bool(self._d.running)

    def copied_bytes(self) -> dict[tuple[str, str, str], int]:
        return self._d.copied_bytes()

    def subscribe(self, callback: Callable[[EventOut], None]) -> Callable[[], None]:
        with self._lock:
            self._next_sub += 1
            key = self._next_sub
            self._subs[key] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subs.pop(key, None)

        return unsubscribe

    # ---- control side ----------------------------------------------------------------------------------------

    def sync(self, req: SyncIn) -> ActionResult:
        links: list[tuple[str, str] | None] = [None]
        if req.source or req.destination:  # half a link = every link from that source / to that destination
            links = [
                (src, dst)
                for src, dst in self._d.config.links()
                if req.source in (None, src) and req.destination in (None, dst)
            ]
            if not links:
                raise NotFoundError("no configured link matches the given source/destination")
        try:
            n = sum(self._d.sync_now(dataset=req.dataset, link=link) for link in links)
        except NotFoundError:
            raise
        except UsageError as exc:
            raise Invalid(str(exc)) from exc
        return ActionResult(ok=True, message=f"queued {n} sync pass(es)", affected=n)

    def pause(self) -> ActionResult:
        self._d.pause()
        return ActionResult(ok=True, message="paused", affected=0)

    def resume(self) -> ActionResult:
        self._d.resume()
        return ActionResult(ok=True, message="resumed", affected=0)

    def set_limits(self, req: LimitsIn) -> LimitsOut:
        kwargs: dict[str, Any] = {}
        if req.global_bps is not None:
            kwargs["bwlimit"] = req.global_bps or None
        if req.links is not None:
            known = {f"{src}->{dst}" for src, dst in self._d.config.links()}
            unknown = sorted(set(req.links) - known)
            if unknown:  # checked here so odd keys never reach the daemon (or a log line) verbatim
                raise NotFoundError(f"unknown link(s): {len(unknown)} (known: {', '.join(sorted(known))})")
            kwargs["per_link"] = {k: (v or None) for k, v in req.links.items()}
        if req.transfers is not None:
            kwargs["transfers"] = req.transfers
        try:
            self._d.set_limits(**kwargs)
        except NotFoundError:
            raise
        except (UsageError, ConfigError) as exc:
            raise Invalid(str(exc)) from exc
        return self.limits()

    def scrub(self, req: ScrubIn) -> ActionResult:
        try:
            n = self._d.scrub(dataset=req.dataset, cluster=req.cluster)
        except NotFoundError:
            raise
        except UsageError as exc:
            raise Invalid(str(exc)) from exc
        return ActionResult(ok=True, message=f"queued {n} scrub(s)", affected=n)

    def retry(self, req: RetryIn) -> ActionResult:
        n = self._d.retry(req.id)  # NotFoundError for an id that is not an open error: 404
        return ActionResult(ok=True, message=f"reset {n} failed shard(s)", affected=n)


def _ferry_version() -> str:
    try:
        from ferry.shard_tools import __version__

        return str(__version__)
    except ImportError:  # pragma: no cover
        return "unknown"
