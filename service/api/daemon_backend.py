"""``ApiBackend`` over the real ``service.daemon.Daemon``: records → pydantic models, events → callbacks.

Besides mapping, it keeps what the daemon does not: a throughput history (sampled every
second), copied bytes per (dataset, link) for /metrics, and, per link, when each version was
first targeted and when it was published (for the SLA share). Those live in memory and start
with the API process. Every string that leaves here is scrubbed of configured secret values.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from shard_tools.errors import ConfigError, UsageError
from shard_tools.threadname import start_named_thread

from .backend import Invalid, NotFound
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
from .rates import RateHistory
from .settings import ApiSettings

__all__ = ["DaemonBackend", "secret_values"]

_PUMP_INTERVAL = 0.05  # seconds between collections of events while they keep coming
_KNOWN_STATES = {"source", "complete", "syncing", "failed", "paused", "unknown"}
_OPEN_ERRORS_CAP = 10_000  # open errors counted for /status (and /metrics), read from the State like /errors


def secret_values(config: Any, token: str | None) -> list[str]:
    """Every credential-like string in the config: storage option values (not booleans/numbers) and the token."""
    out: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict) or hasattr(node, "items"):
            for value in node.values():
                walk(value)
        elif isinstance(node, str) and len(node) >= 4 and "://" not in node:
            out.add(node)

    for cluster in getattr(config, "clusters", {}).values():
        walk(dict(getattr(cluster, "storage_options", {}) or {}))
    if token:
        out.add(token)
    return sorted(out, key=len, reverse=True)


class DaemonBackend:
    """Adapts a running Daemon to the API; call ``close()`` to stop its two helper threads."""

    def __init__(self, daemon: Any, settings: ApiSettings, *, sample_interval: float = 1.0) -> None:
        self._d = daemon
        self._settings = settings
        self._secrets = secret_values(daemon.config, settings.token)
        self._rates = RateHistory(horizon=3600.0, min_interval=sample_interval)
        self._copied: dict[tuple[str, str, str], int] = {}
        self._sla: dict[tuple[str, str, str], list[float | None]] = {}  # (ds, dst, version) -> [first_seen, done]
        self._subs: dict[int, Callable[[EventOut], None]] = {}
        self._next_sub = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sources = {r.source for r in daemon.config.rules}
        self._dests = {d for r in daemon.config.rules for d in r.destinations}
        self._queue = daemon.subscribe(maxsize=10_000)
        self._sample_once()  # a baseline, so bytes copied before the first tick still show as throughput
        self._threads = [
            start_named_thread(self._pump, "ferry-api-event"),
            start_named_thread(self._sample, "ferry-api-rates", (sample_interval,)),
        ]

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the event pump and the sampler; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._d.unsubscribe(self._queue)
        for t in self._threads:
            t.join(timeout=5)

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
        if ev.kind == "shard_verified":
            key = (str(raw.get("dataset")), str(raw.get("src")), str(raw.get("dst")))
            with self._lock:
                self._copied[key] = self._copied.get(key, 0) + int(raw.get("bytes") or 0)
        elif ev.kind == "version_published":
            self._on_published(raw)
        with self._lock:
            subs = list(self._subs.values())
        for cb in subs:
            cb(ev)

    def _on_published(self, raw: dict[str, Any]) -> None:
        """Close the SLA record of (dataset, cluster, version); open it from history if sampling missed the start."""
        ds, cluster, version = str(raw.get("dataset")), str(raw.get("cluster")), str(raw.get("version"))
        done = float(raw.get("ts") or time.time())
        with self._lock:
            rec = self._sla.get((ds, cluster, version))
        if rec is None or rec[0] is None:
            try:
                starts = [
                    h.started_at
                    for h in self._d.history(limit=1000, dataset=ds)
                    if h.version == version and h.dst == cluster
                ]
            except Exception:  # the daemon is stopping: no record rather than a wrong one
                return
            rec = [min(starts, default=done), None]
        rec[1] = done
        with self._lock:
            self._sla[(ds, cluster, version)] = rec

    def _sample(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self._sample_once()
            except Exception:  # a failing read (daemon stopping) must not kill the sampler
                if not self._d.running:
                    return

    def _sample_once(self) -> None:
        now = time.time()
        in_flight = sum(t.bytes_done for t in self._d.transfers())
        self._rates.add(now, float(self._d.stats().bytes_copied + in_flight))
        for cell in self._d.replica_matrix():
            if cell.role != "destination" or not cell.target_version:
                continue
            key = (cell.dataset, cell.cluster, cell.target_version)
            published = cell.published_version == cell.target_version
            with self._lock:
                if key not in self._sla:  # already published when first seen (a restart): timing unknown, not counted
                    self._sla[key] = [None, None] if published else [now - (cell.lag_seconds or 0.0), None]

    def _event(self, raw: dict[str, Any]) -> EventOut:
        data = {k: self._clean(v) for k, v in raw.items() if k not in ("type", "ts")}
        return EventOut(kind=str(raw.get("type", "event")), time=float(raw.get("ts") or time.time()), data=data)

    def _clean(self, value: Any) -> Any:
        """Replace any configured secret inside a string (error messages may quote a backend's text)."""
        if isinstance(value, str):
            for s in self._secrets:
                if s in value:
                    value = value.replace(s, "***")
            return value
        if isinstance(value, dict):
            return {k: self._clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._clean(v) for v in value]
        return value

    # ---- read side -------------------------------------------------------------------------------------------

    def clusters(self) -> list[ClusterOut]:
        return [
            ClusterOut(
                name=c.name,
                url=self._clean(c.url),
                protocol=urlsplit(c.url).scheme if "://" in c.url else "file",
                priority=c.priority,
                is_source=c.name in self._sources,
                is_destination=c.name in self._dests,
            )
            for c in self._d.clusters()
        ]

    def _summary(self, info: Any) -> DatasetSummary:
        return DatasetSummary(
            name=info.name,
            source=info.source,
            destinations=list(info.destinations),
            version=info.version_id,
            versions=len(info.versions),
            shards=info.shards,
            bytes=info.bytes,
            tokens=info.tokens,
        )

    def datasets(self) -> list[DatasetSummary]:
        return [self._summary(d) for d in self._d.datasets()]

    def dataset(self, name: str, shard_limit: int) -> DatasetDetail | None:
        try:
            info = self._d.dataset(name)
        except KeyError:
            return None
        return DatasetDetail(
            name=info.name,
            source=info.source,
            destinations=list(info.destinations),
            version=info.version_id,
            versions=list(info.versions),
            shards=info.shards,
            bytes=info.bytes,
            tokens=info.tokens,
            replicas=[self._cell(r) for r in info.replicas],
        )

    @staticmethod
    def _cell(r: Any) -> ReplicaCell:
        total_b, done_b = int(r.total_bytes), int(r.verified_bytes)
        total_s, done_s = int(r.total_shards), int(r.verified_shards)
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
        cells = [self._cell(r) for r in self._d.replica_matrix()]
        datasets = list(dict.fromkeys(c.dataset for c in cells))
        clusters = [c.name for c in self._d.clusters()]
        return ReplicaMatrix(datasets=datasets, clusters=clusters, cells=cells)

    def transfers(self) -> list[TransferOut]:
        out = []
        for t in self._d.transfers():
            total = max(int(t.bytes_total), 0)
            out.append(
                TransferOut(
                    id=int(t.id),
                    dataset=t.dataset,
                    version=t.version,
                    shard=t.shard,
                    source=self._clean(t.src),
                    destination=self._clean(t.dst),
                    bytes_done=int(t.bytes_done),
                    bytes_total=total,
                    percent=round(100.0 * min(t.bytes_done, total) / total, 2) if total else 0.0,
                    rate_bps=float(t.rate),
                    started_at=float(t.started_at),
                )
            )
        return out

    def history(self, limit: int, dataset: str | None) -> list[HistoryEntry]:
        return [
            HistoryEntry(
                id=h.id,
                dataset=h.dataset,
                version=h.version,
                shard=h.shard,
                source=self._clean(h.src),
                destination=self._clean(h.dst),
                bytes=h.bytes,
                started_at=h.started_at,
                duration_s=h.duration_s,
                ok=h.ok,
                error=self._clean(h.error),
            )
            for h in self._d.history(limit=limit, dataset=dataset)
        ]

    def errors(self, limit: int) -> list[ErrorEntry]:
        return [
            ErrorEntry(
                id=e.id,
                at=e.at,
                dataset=e.dataset,
                version=e.version,
                cluster=e.cluster,
                shard=e.shard,
                reason=self._clean(e.message),
                retryable=e.retryable,
                attempts=e.attempts,
            )
            for e in self._d.errors(limit=limit)
        ]

    def _link_of(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(dataset, destination) → (source, destination) for every replicated dataset."""
        return {(d.name, dst): (d.source, dst) for d in self._d.datasets() for dst in d.destinations}

    def links(self) -> list[LinkOut]:
        sla_s = self._settings.sla_minutes * 60.0
        now = time.time()
        lim = self._d.limits()
        rates: dict[tuple[str, str], float] = {}
        for t in self._d.transfers():
            rates[(t.src, t.dst)] = rates.get((t.src, t.dst), 0.0) + float(t.rate)
        of = self._link_of()
        lag: dict[tuple[str, str], float] = {}
        for cell in self._d.replica_matrix():
            link = of.get((cell.dataset, cell.cluster))
            if link is not None and cell.role == "destination":
                lag[link] = max(lag.get(link, 0.0), float(cell.lag_seconds or 0.0))
        totals: dict[tuple[str, str], list[int]] = {}
        with self._lock:
            records = list(self._sla.items())
        for (ds, dst, _version), (first, done) in records:
            link = of.get((ds, dst))
            if link is None or first is None:
                continue
            elapsed = (done if done is not None else now) - first
            counted = totals.setdefault(link, [0, 0])
            if done is not None or elapsed > sla_s:  # a pending version counts once it has missed the SLA
                counted[0] += 1
                counted[1] += int(done is not None and elapsed <= sla_s)
        out = []
        for src, dst in self._d.config.links():
            total, within = totals.get((src, dst), [0, 0])
            out.append(
                LinkOut(
                    source=src,
                    destination=dst,
                    lag_seconds=lag.get((src, dst), 0.0),
                    sla_minutes=self._settings.sla_minutes,
                    versions_total=total,
                    versions_within_sla=within,
                    share_within_sla=(within / total) if total else None,
                    limit_bps=lim.per_link.get(f"{src}->{dst}"),
                    rate_bps=rates.get((src, dst), 0.0),
                )
            )
        return out

    def throughput(self, seconds: float, buckets: int) -> ThroughputOut:
        points = self._rates.buckets(time.time(), seconds, buckets)
        return ThroughputOut(
            bucket_seconds=seconds / buckets, points=[ThroughputPoint(t=t, bps=max(0.0, v)) for t, v in points]
        )

    def limits(self) -> LimitsOut:
        lim = self._d.limits()
        return LimitsOut(transfers=lim.transfers, global_bps=lim.bwlimit, links=dict(lim.per_link))

    def status(self) -> StatusOut:
        st = self._d.stats()
        return StatusOut(
            paused=bool(self._d.paused),
            ready=self.ready(),
            version=_ferry_version(),
            uptime_seconds=st.uptime_seconds,
            transfers_in_flight=st.in_flight,
            # the failed shards /errors lists, not the Stats counter of every failed attempt since start
            open_errors=len(self._d.errors(limit=_OPEN_ERRORS_CAP)),
            copied_bytes_total=st.bytes_copied,
            rate_bps=st.rate_instant,
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
        with self._lock:
            return dict(self._copied)

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
                raise NotFound("no configured link matches the given source/destination")
        try:
            n = sum(self._d.sync_now(dataset=req.dataset, link=link) for link in links)
        except UsageError as exc:
            raise NotFound(str(exc)) from exc
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
                raise NotFound(f"unknown link(s): {len(unknown)} (known: {', '.join(sorted(known))})")
            kwargs["per_link"] = {k: (v or None) for k, v in req.links.items()}
        if req.transfers is not None:
            kwargs["transfers"] = req.transfers
        try:
            self._d.set_limits(**kwargs)
        except UsageError as exc:
            raise NotFound(str(exc)) from exc
        except ConfigError as exc:
            raise Invalid(str(exc)) from exc
        return self.limits()

    def scrub(self, req: ScrubIn) -> ActionResult:
        try:
            n = self._d.scrub(dataset=req.dataset, cluster=req.cluster)
        except UsageError as exc:
            raise NotFound(str(exc)) from exc
        return ActionResult(ok=True, message=f"queued {n} scrub(s)", affected=n)

    def retry(self, req: RetryIn) -> ActionResult:
        try:
            n = self._d.retry(req.id)
        except KeyError as exc:
            raise NotFound(f"no open error with id {req.id}") from exc
        return ActionResult(ok=True, message=f"reset {n} failed shard(s)", affected=n)


def _ferry_version() -> str:
    try:
        from shard_tools import __version__

        return str(__version__)
    except ImportError:  # pragma: no cover
        return "unknown"
