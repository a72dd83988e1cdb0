"""The long-running replication daemon: polls the rules, runs sync passes and scrubs.

One loop thread plans and runs passes one (dataset, destination) at a time; the copies of
a pass run on the executor's pool. Everything the API reads is in memory or one SQLite
query away; control calls only set flags and wake the loop. See INTERFACE.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ferry.shard_tools.errors import (
    ConfigError,
    FerryError,
    LeaseHeldError,
    ManifestError,
    NotFoundError,
    RollbackError,
    StorageError,
)
from ferry.shard_tools.format.header import MANIFEST_FILE
from ferry.shard_tools.storage.store import Location, resolve
from ferry.shard_tools.threadname import start_named_thread

from .config import Config, Rule, link_name, parse_rate
from .events import EventBus
from .jobs.registry import JobRegistry
from .jobs.stager import Stager
from .names import name_problem
from .records import (
    ClusterInfo,
    DatasetInfo,
    Egress,
    ErrorInfo,
    HistoryEntry,
    LimitsInfo,
    ReplicaStatus,
    ScrubReport,
    StatsSnapshot,
    TransferInfo,
    VersionTiming,
)
from .replication.engine import Engine, PassResult, read_header
from .replication.state import State
from .transfer.bandwidth import Bandwidth
from .transfer.copier import make_copier
from .transfer.executor import Executor
from .transfer.hashed_io import CHUNK_SIZE
from .transfer.object_store import skip_double_checksums
from .transfer.stats import Stats

__all__ = ["Daemon", "UNCHANGED"]

log = logging.getLogger("ferry.daemon")
# subjects of a destination's dataset-level open errors (beside shard paths)
_PUBLISH = "manifest.json"
_LEASE = ".ferry-lease.json"
_ACCESS = "(destination)"  # the dataset copy cannot be written at all (read-only, access refused)


def _fields(
    dataset: str | None, cluster: str, source: str | None = None, failed_shards: list[str] | None = None
) -> dict[str, Any]:
    """``extra=`` of a log call about a dataset: the fields ``ferry serve --log-format json`` writes."""
    return {"dataset": dataset, "cluster": cluster, "source": source, "failed_shards": failed_shards or None}


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


#: Default of ``set_limits(bwlimit=...)``: leave the global limit as it is.
UNCHANGED: Any = _Unchanged()


@dataclass
class _Known:
    """What the daemon last saw of a dataset at its source."""

    name: str
    source: str
    destinations: tuple[str, ...]
    version_id: str | None = None
    versions: list[str] = field(default_factory=list)
    shards: int = 0
    bytes: int = 0
    tokens: int = 0
    cells: dict[str, PassResult] = field(default_factory=dict)  # destination → latest pass


class Daemon:
    """Polls the rules, runs sync passes and scrubs on background threads."""

    def __init__(self, config: Config, *, chunk_size: int | None = None) -> None:
        self._config = config
        skip_double_checksums()
        self._stats = Stats()
        self.events = EventBus()
        lim = config.limits
        self.bandwidth = Bandwidth(lim.bwlimit, lim.per_link, node_rate=config.transfer.node_bwlimit)
        self.executor = Executor(
            transfers=lim.transfers, bandwidth=self.bandwidth, stats=self._stats, events=self.events,
            retries=lim.retries, chunk_size=chunk_size or CHUNK_SIZE,
            copier=make_copier(config.transfer, self.bandwidth, chunk_size or CHUNK_SIZE),
        )  # fmt: skip
        self.state = State(config.state_dir)  # after the copier: a Ray engine that cannot start leaves nothing open
        priority = {c.name: c.priority for c in config.clusters.values()}
        self.engine = Engine(
            self.executor,
            self.state,
            events=self.events,
            keep_versions=config.keep_versions,
            priority=priority,
            swarm=config.swarm,
            links=tuple(config.link_specs.values()),
        )
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}
        self._locations: dict[tuple[str, str], Location] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._started = False
        self._targets: list[tuple[str | None, tuple[str, str] | None]] = []
        self._scrubs: queue.SimpleQueue[tuple[str | None, str | None]] = queue.SimpleQueue()
        self._last_scrub = time.monotonic()
        self._thread: threading.Thread | None = None
        self._problems = self.state.problems()  # (dataset, cluster, subject) of open dataset-level errors
        self._refused: dict[tuple[str, str], str] = {}  # (dataset, dest) → source version refused there
        self.passes = 0  # completed polls (tests wait on it)
        # training jobs register here through the API; with [staging], their coming shards are staged
        self.jobs = JobRegistry(lambda: [(c.name, c.url) for c in config.clusters.values()])
        self.stager = None if config.staging is None else Stager(self.jobs, config.staging, config.clusters)

    # life cycle
    @property
    def config(self) -> Config:
        return self._config

    @property
    def running(self) -> bool:
        return self._started and not self._stopped.is_set()

    @property
    def paused(self) -> bool:
        return self.executor.paused

    def start(self) -> None:
        """Start the loop thread (the first poll begins at once)."""
        if self._started:
            return
        self._started = True
        # `ferry sync` loads the shard-table code (numpy, pyarrow) only when a pass has work; a
        # daemon loads it up front so its first pass does not wait for those imports.
        import ferry.shard_tools.format.manifest  # noqa: F401

        self._thread = start_named_thread(self._loop, "ferry-daemon")
        if self.stager is not None:
            self.stager.start()
        log.info("daemon started: %d clusters, %d rules, state in %s",
                 len(self._config.clusters), len(self._config.rules), self._config.state_dir)  # fmt: skip

    def stop(self, timeout: float | None = 30.0) -> None:
        """Start no new transfers, let those in flight finish (up to ``timeout``), close the state."""
        if self._stopped.is_set():
            return
        self._stopping.set()
        self._wake.set()
        if self.stager is not None:
            self.stager.stop(timeout or 30.0)
        self.executor.shutdown(timeout)
        if self._thread is not None:
            self._thread.join(timeout=(timeout or 30.0) + 15.0)
        self._stopped.set()
        self.state.close()
        log.info("daemon stopped")

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # the loop
    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stopping.is_set():
            now = time.monotonic()
            self._wake.wait(max(0.0, next_poll - now))
            if self._stopping.is_set():
                break
            self._wake.clear()
            with self._lock:
                targets, self._targets = self._targets, []
            periodic = time.monotonic() >= next_poll
            if periodic:
                next_poll = time.monotonic() + self._config.poll_interval
                targets = [(None, None)]
            if targets:
                self._poll(targets)
                self.passes += 1
            self._run_scrubs()

    def _location(self, cluster: str, dataset: str = "") -> Location:
        key = (cluster, dataset)
        loc = self._locations.get(key)
        if loc is None:
            c = self._config.clusters[cluster]
            loc = resolve(c.dataset_url(dataset) if dataset else c.url, c.storage_options)
            self._locations[key] = loc
        return loc

    def _datasets_at(self, rule: Rule) -> list[str]:
        root = self._location(rule.source)
        return [n for n in root.listdir("") if rule.matches(n)]

    def _pairs(
        self, targets: list[tuple[str | None, tuple[str, str] | None]], listed: dict[str, set[str]]
    ) -> Iterator[tuple[Rule, str, str]]:
        """(rule, dataset, destination) to pass over; ``listed`` collects the datasets each source
        cluster holds (only clusters whose every listing succeeded)."""
        unlisted: set[str] = set()
        for rule in self._config.rules:
            try:
                names = self._datasets_at(rule)
            except FerryError as exc:
                unlisted.add(rule.source)
                listed.pop(rule.source, None)
                self._report_failure(None, rule.source, f"cannot list datasets at {rule.source}: {exc}")
                continue
            if rule.source not in unlisted:
                listed.setdefault(rule.source, set()).update(names)
            for name in names:
                if not self._name_allowed(rule, name):
                    continue
                dests = [
                    d
                    for d in rule.destinations
                    if any((ds in (None, name)) and (ln in (None, (rule.source, d))) for ds, ln in targets)
                ]
                for d in dests:
                    yield rule, name, d

    def _poll(self, targets: list[tuple[str | None, tuple[str, str] | None]]) -> None:
        headers: dict[tuple[str, str], Any] = {}
        listed: dict[str, set[str]] = {}
        for rule, name, dest in self._pairs(targets, listed):
            if self._stopping.is_set():
                return
            key = (rule.source, name)
            try:
                if key not in headers:  # one read of the source manifest per dataset per poll
                    headers[key] = self._source_header(rule, name)
                header = headers[key]
                if header is None:
                    continue
                if self._config.cluster not in (None, dest):  # that cluster's own daemon copies: just look
                    self._note_peer(name, rule.source, dest, header)
                    continue
                if self._refused.get((name, dest)) == header[1]["version_id"]:
                    continue  # refused as a rollback: not retried until the source changes or retry() is called
                clusters = dict.fromkeys([rule.source, *rule.destinations])
                locations = {c: self._location(c, name) for c in clusters}
                known = self._known[name]

                def on_plan(res: PassResult, known: _Known = known, dest: str = dest) -> None:
                    with self._lock:
                        known.cells[dest] = res

                res = self._sync(name, rule.source, dest, locations, header, on_plan)
                if res is None:
                    continue
                if not res.up_to_date:
                    log.info(
                        "%s %s->%s: version %s, copied %d (%d bytes), verified in place %d, failed %d%s",
                        name, rule.source, dest, res.version_id[:12], res.copied, res.copied_bytes,
                        res.verified_in_place, len(res.failed), ", published" if res.published else "",
                        extra=_fields(name, dest, rule.source, [r.job.shard.path for r in res.failed]),
                    )  # fmt: skip
            except FerryError as exc:
                self._report_failure(name, dest, str(exc))
            except Exception as exc:  # noqa: BLE001 - the loop must survive any single pass
                log.exception("pass %s %s->%s crashed", name, rule.source, dest, extra=_fields(name, dest, rule.source))
                self._report_failure(name, dest, f"{type(exc).__name__}: {exc}")
        self._forget_problems(listed)

    def _sync(
        self,
        name: str,
        source: str,
        dest: str,
        locations: Mapping[str, Location],
        header: tuple[bytes, dict[str, Any]],
        on_plan: Any,
    ) -> PassResult | None:
        """One pass; a refused rollback or another writer's lease is an open error of the destination
        (None returned), cleared by the next pass that gets through."""
        version = str(header[1]["version_id"])
        try:
            res = self.engine.sync_pass(name, source, dest, locations, src_header=header, on_plan=on_plan)
        except RollbackError as exc:
            self._refused[(name, dest)] = version
            self._open_problem(name, dest, _PUBLISH, str(exc), retryable=False)
            return None
        except LeaseHeldError as exc:
            self._stats.set_writer(name, dest, exc.holder)
            self._open_problem(name, dest, _LEASE, str(exc), retryable=True)
            return None
        except StorageError as exc:
            if exc.retryable:
                raise
            self._open_problem(name, dest, _ACCESS, str(exc), retryable=False)  # looked at again next poll
            return None
        self._refused.pop((name, dest), None)
        self._stats.set_writer(name, dest, None)
        for subject in (_PUBLISH, _LEASE, _ACCESS):
            self._clear_problem(name, dest, subject)
        return res

    def _name_allowed(self, rule: Rule, name: str) -> bool:
        """Whether ``name`` passes the API's name rule. A dataset the API could not address (sync, scrub,
        inspect) is not replicated but reported, until it is renamed."""
        problem = name_problem(name)
        if problem is None:
            return True
        try:
            is_dataset = self._location(rule.source).exists(f"{name}/{MANIFEST_FILE}")
        except FerryError:
            is_dataset = True  # cannot tell: report it rather than hide it
        if is_dataset:
            message = f"dataset name {name!r} at {rule.source} is not allowed: {problem}; rename it"
            self._open_problem(name, rule.source, "", message, retryable=False)
        else:  # some other file or folder beside the datasets
            self._clear_problem(name, rule.source, "")
        return False

    def _source_header(self, rule: Rule, name: str) -> tuple[bytes, dict[str, Any]] | None:
        """The source's manifest header, noted; None where there is none, or where it cannot be read:
        that is an open error of the dataset at its source until a read succeeds again."""
        try:
            header = read_header(self._location(rule.source, name))
        except (ManifestError, StorageError) as exc:
            message = f"dataset {name!r} at {rule.source}: cannot read its {MANIFEST_FILE}: {exc}"
            if isinstance(exc, ManifestError) and "restore" not in message:  # some messages say what to do
                message += "; restore it from versions/ or re-pack the dataset"
            retryable = isinstance(exc, StorageError) and exc.retryable  # a broken file stays broken
            self._open_problem(name, rule.source, MANIFEST_FILE, message, retryable=retryable)
            self._note_source(name, rule, None)
            return None
        self._clear_problem(name, rule.source, MANIFEST_FILE)
        self._note_source(name, rule, header)
        return header

    def _open_problem(self, dataset: str, cluster: str, subject: str, message: str, *, retryable: bool) -> None:
        """Keep ``message`` as an open error of ``dataset`` at ``cluster``; logged and published when new."""
        self._problems.add((dataset, cluster, subject))
        error_id = self.state.open_problem(dataset, cluster, subject, message, retryable=retryable)
        if error_id is None:
            return
        log.warning("%s", message, extra=_fields(dataset, cluster))
        self._stats.error(dataset, cluster, retryable=retryable)
        self.events.publish(
            "error", id=error_id, dataset=dataset, version=None, cluster=cluster, shard=subject or None,
            reason=message, retryable=retryable, attempts=1,
        )  # fmt: skip

    def _clear_problem(self, dataset: str, cluster: str, subject: str) -> None:
        key = (dataset, cluster, subject)
        if key in self._problems:
            self._problems.discard(key)
            self.state.clear_problem(*key)
            log.info("dataset %r at %s: %s is fine again", dataset, cluster, subject or "its name",
                     extra=_fields(dataset, cluster))  # fmt: skip

    def _forget_problems(self, listed: Mapping[str, set[str]]) -> None:
        """Clear the problems of datasets no longer at their (fully listed) source: deleted or renamed."""
        for dataset, cluster, subject in list(self._problems):
            if cluster in listed and dataset not in listed[cluster]:
                self._clear_problem(dataset, cluster, subject)

    def _note_peer(self, name: str, source: str, dest: str, src_header: tuple[bytes, dict[str, Any]]) -> None:
        """A destination another daemon serves: read its manifest.json (one small read) for the matrix."""
        res = PassResult.of_source(name, source, dest, src_header[1])
        peer = read_header(self._location(dest, name))
        if peer is not None and peer[1]["version_id"] == res.version_id:
            res.mark_up_to_date()
        with self._lock:
            self._known[name].cells[dest] = res

    def _report_failure(self, dataset: str | None, cluster: str, message: str) -> None:
        log.warning("%s", message, extra=_fields(dataset, cluster))
        self._stats.error(dataset or "", cluster, retryable=True)
        self.events.publish(
            "error", id=None, dataset=dataset, version=None, cluster=cluster, shard=None, reason=message,
            retryable=True, attempts=1,
        )  # fmt: skip

    def _note_source(self, name: str, rule: Rule, header: tuple[bytes, dict[str, Any]] | None) -> None:
        with self._lock:
            known = self._known.get(name)
            if known is None:
                known = self._known[name] = _Known(name, rule.source, rule.destinations)
            if header is None:
                return
            doc = header[1]
            known.version_id = str(doc["version_id"])
            if known.version_id not in known.versions:
                known.versions.append(known.version_id)
            totals = doc["totals"]
            known.shards, known.bytes, known.tokens = totals["shards"], totals["stored_bytes"], totals["tokens"]

    def _run_scrubs(self) -> None:
        interval = self._config.scrub_interval
        if interval and time.monotonic() - self._last_scrub >= interval:
            self._last_scrub = time.monotonic()
            self._scrubs.put((None, None))
        while not self._stopping.is_set():
            try:
                dataset, cluster = self._scrubs.get_nowait()
            except queue.Empty:
                return
            for name, known in list(self._known.items()):
                if dataset not in (None, name):
                    continue
                clusters = [known.source, *known.destinations]
                locations = {c: self._location(c, name) for c in clusters}
                for c in clusters:
                    if cluster not in (None, c) or self._config.cluster not in (None, c) or self._stopping.is_set():
                        continue
                    t0, wall = time.monotonic(), time.time()
                    try:
                        checked, bad, repaired = self.engine.scrub(name, c, locations)
                    except FerryError as exc:
                        self._report_failure(name, c, f"scrub failed: {exc}")
                        continue
                    report = ScrubReport(name, c, checked, bad, repaired, wall, time.monotonic() - t0)
                    self.state.add_scrub(report)
                    self.events.publish(
                        "scrub", dataset=name, cluster=c, checked=checked, bad=len(bad), repaired=len(repaired)
                    )  # fmt: skip
                    log.info("scrub %s at %s: %d checked, %d bad, %d repaired", name, c, checked, len(bad),
                             len(repaired), extra=_fields(name, c))  # fmt: skip

    # read side
    def clusters(self) -> list[ClusterInfo]:
        rules = self._config.rules
        sources, dests = {r.source for r in rules}, {d for r in rules for d in r.destinations}
        return [
            ClusterInfo(
                c.name,
                c.public_url,
                urlsplit(c.url).scheme if "://" in c.url else "file",
                c.priority,
                c.name in sources,
                c.name in dests,
            )  # fmt: skip
            for c in self._config.clusters.values()
        ]

    def _replicas(self, known: _Known, lag: Mapping[tuple[str, str, str], float]) -> list[ReplicaStatus]:
        failed_at = {e.cluster for e in self.state.errors(limit=10_000) if e.dataset == known.name}
        out = [
            ReplicaStatus(
                known.name,
                known.source,
                "source",
                known.version_id,
                known.version_id,
                known.shards,
                known.shards,
                known.bytes,
                known.bytes,
                "source",
                None,
            )  # fmt: skip
        ]
        for dest in known.destinations:
            res = known.cells.get(dest)
            if res is None or res.version_id != known.version_id:
                out.append(ReplicaStatus(known.name, dest, "destination", known.version_id, None, 0, known.shards, 0,
                                         known.bytes, "paused" if self.paused else "unknown",
                                         lag.get((known.name, dest, known.version_id or ""))))  # fmt: skip
                continue
            done = res.already_verified + res.copied + res.verified_in_place
            complete = res.up_to_date or res.published
            if complete:
                state = "complete"
            elif dest in failed_at or res.failed:
                state = "failed"
            elif self.paused:
                state = "paused"
            else:
                state = "syncing"
            out.append(ReplicaStatus(
                known.name, dest, "destination", known.version_id, res.version_id if complete else None,
                res.total_shards if complete else done, res.total_shards,
                res.total_bytes if complete else res.verified_bytes, res.total_bytes, state,
                None if complete else lag.get((known.name, dest, res.version_id)),
            ))  # fmt: skip
        return out

    def _lag(self) -> dict[tuple[str, str, str], float]:
        """(dataset, cluster, version) → seconds the version has been wanted there and is not yet published."""
        now = time.time()
        return {
            (v.dataset, v.cluster, v.version): max(0.0, now - v.first_seen)
            for v in self.state.version_timings()
            if v.completed is None
        }

    def datasets(self) -> list[DatasetInfo]:
        lag = self._lag()
        with self._lock:
            known = list(self._known.values())
            return [
                DatasetInfo(
                    k.name,
                    k.source,
                    list(k.destinations),
                    k.version_id,
                    list(k.versions),
                    k.shards,
                    k.bytes,
                    k.tokens,
                    self._replicas(k, lag),
                )  # fmt: skip
                for k in sorted(known, key=lambda k: k.name)
            ]

    def dataset(self, name: str) -> DatasetInfo:
        for d in self.datasets():
            if d.name == name:
                return d
        raise NotFoundError(f"no dataset named {name!r} is replicated (or it has not been seen at its source yet)")

    def replica_matrix(self) -> list[ReplicaStatus]:
        return [r for d in self.datasets() for r in d.replicas]

    def transfers(self) -> list[TransferInfo]:
        return self._stats.transfers()

    def history(self, limit: int = 100, dataset: str | None = None) -> list[HistoryEntry]:
        return self.state.history(limit, dataset)

    def errors(self, limit: int = 100) -> list[ErrorInfo]:
        return self.state.errors(limit)

    def stats(self) -> StatsSnapshot:
        return self._stats.snapshot()

    def copied_bytes(self) -> dict[tuple[str, str, str], int]:
        """Verified bytes copied since start, keyed (dataset, source, destination)."""
        return self._stats.copied_bytes()

    def egress(self) -> list[Egress]:
        """Bytes the last versions sent over each link into this daemon's destinations (every copy attempt's)."""
        return self.state.egress()

    def planned_rates(self) -> dict[tuple[str, str], float]:
        """(source, destination) → bytes/s of the last routed swarm plan into each destination here."""
        return dict(self.engine.planned)

    def version_timings(self) -> list[VersionTiming]:
        """When each version was wanted at each destination and when it was published there."""
        return self.state.version_timings()

    def other_writers(self) -> dict[tuple[str, str], str]:
        """(dataset, destination) → the other writer whose lease kept this daemon out, last pass."""
        return self._stats.other_writers()

    def limits(self) -> LimitsInfo:
        return LimitsInfo(self.executor.transfers, self.bandwidth.global_bucket.rate, self.bandwidth.link_rates())

    def scrub_reports(self, limit: int = 20) -> list[ScrubReport]:
        return self.state.scrubs(limit)

    def subscribe(self, maxsize: int = 1000) -> queue.Queue[dict[str, Any]]:
        return self.events.subscribe(maxsize)

    def unsubscribe(self, q: queue.Queue[dict[str, Any]]) -> None:
        self.events.unsubscribe(q)

    # control side
    def _check_link(self, link: tuple[str, str]) -> None:
        if tuple(link) not in self._config.links():
            raise NotFoundError(f"no rule replicates {link[0]} -> {link[1]}")

    def sync_now(self, dataset: str | None = None, link: tuple[str, str] | None = None) -> int:
        """Queue a pass for matching (dataset, link) pairs now; returns how many pairs match."""
        if link is not None:
            link = (str(link[0]), str(link[1]))
            self._check_link(link)
        if dataset is not None and not any(r.matches(dataset) for r in self._config.rules):
            raise NotFoundError(f"no rule replicates a dataset named {dataset!r}")
        with self._lock:
            if dataset is not None and self._known and dataset not in self._known:
                raise NotFoundError(f"dataset {dataset!r} has not been seen at any source")
            count = sum(
                1
                for k in self._known.values()
                for d in k.destinations
                if dataset in (None, k.name) and link in (None, (k.source, d))
            )
            self._targets.append((dataset, link))
        self._wake.set()
        return max(count, 1)

    def pause(self) -> None:
        self.executor.pause()
        self.events.publish("state", paused=True)

    def resume(self) -> None:
        self.executor.resume()
        self.events.publish("state", paused=False)
        self._wake.set()

    def set_limits(
        self,
        *,
        bwlimit: Any = UNCHANGED,
        per_link: Mapping[str, float | str | None] | None = None,
        transfers: int | None = None,
    ) -> LimitsInfo:
        """Change limits at run time (rates: bytes/s, a string such as "100MiB/s", or None = unlimited)."""
        links = {link_name(s, d) for s, d in self._config.links()}
        new_links: dict[str, float | None] = {}
        for link, rate in (per_link or {}).items():
            src, _, dst = link.partition("->")
            name = link_name(src.strip(), dst.strip())
            if name not in links:
                raise NotFoundError(f"unknown link {link!r} (known: {', '.join(sorted(links))})")
            new_links[name] = parse_rate(rate, f"per_link[{link}]")
        new_global = parse_rate(bwlimit, "bwlimit") if bwlimit is not UNCHANGED else UNCHANGED
        if transfers is not None and (isinstance(transfers, bool) or int(transfers) < 1):
            raise ConfigError(f"transfers must be at least 1, got {transfers!r}")
        if new_global is not UNCHANGED:
            self.bandwidth.set_global(new_global)
        for name, rate in new_links.items():
            self.bandwidth.set_link(name, rate)
        if transfers is not None:
            self.executor.set_transfers(int(transfers))
        info = self.limits()
        self.events.publish(
            "state", paused=self.paused,
            limits={"transfers": info.transfers, "global_bps": info.global_bps, "links": info.links},
        )  # fmt: skip
        return info

    def scrub(self, dataset: str | None = None, cluster: str | None = None) -> int:
        """Queue a scrub of ``dataset`` at ``cluster`` (None: all); returns how many scrubs that makes."""
        if cluster is not None and cluster not in self._config.clusters:
            raise NotFoundError(f"unknown cluster {cluster!r}")
        with self._lock:
            if dataset is not None and dataset not in self._known:
                raise NotFoundError(f"dataset {dataset!r} has not been seen at any source")
            count = sum(
                1
                for k in self._known.values()
                for c in (k.source, *k.destinations)
                if dataset in (None, k.name) and cluster in (None, c)
            )
        self._scrubs.put((dataset, cluster))
        self._wake.set()
        return count

    def retry(self, error_id: int | None = None) -> int:
        """Make one failed shard (or all) pending again and sync now; returns how many were reset."""
        if error_id is not None and not self.state.error_exists(int(error_id)):
            raise NotFoundError(f"no open error with id {error_id}")
        n = self.state.reset_failed(None if error_id is None else int(error_id))
        with self._lock:
            self._refused.clear()  # an operator asked: refused publishes are tried again too
            self._targets.append((None, None))
        self._wake.set()
        return n
