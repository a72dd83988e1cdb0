"""Tell the cluster's ferry daemon what a loader will read: register its plan, then heartbeat its position.

Best-effort and off the critical path: one background thread per loader does every request, each with
a short timeout; the training loop never waits on it and nothing it meets (a daemon that is down, slow,
stopped, refusing the token) reaches the loader: it is logged once and retried at the next heartbeat.
The daemon is found as ``ferry status`` finds it: the ``service`` argument, else ``$FERRY_SERVICE_URL``;
the token is ``$FERRY_API_TOKEN`` (the daemon's ``[api] token_env`` default).

The reporter reads the loader through the few public attributes every ``TokenLoader`` has (``dataset``,
``position``, ``epoch``, ``stats()``, ``batch_size``, ``rank``, ``world_size``) and holds it only weakly:
a loader that is dropped ends its reporter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

import httpx

from ferry.shard_tools.errors import UsageError
from ferry.shard_tools.threadname import start_named_thread

from .job_types import Heartbeat, JobEra, JobPhase, JobStats, Registration, SourcePlan

__all__ = ["JobReporter", "registration_of", "report_jobs", "stats_of", "SERVICE_URL_ENV", "TOKEN_ENV", "NAME_ENV"]

SERVICE_URL_ENV = "FERRY_SERVICE_URL"
TOKEN_ENV = "FERRY_API_TOKEN"
NAME_ENV = "FERRY_JOB_NAME"
HEARTBEAT_ENV = "FERRY_JOB_HEARTBEAT"
DEFAULT_HEARTBEAT_S = 5.0
REQUEST_TIMEOUT_S = 2.0  # one request, connect to last byte
_log = logging.getLogger("ferry.jobs")


def report_jobs(loader: Any, service: str | bool | None) -> JobReporter | None:
    """Start reporting ``loader`` to the daemon at ``service`` (None: ``$FERRY_SERVICE_URL``; False or "": off)."""
    if service is False:
        return None
    if service is not None and not isinstance(service, str) or service is True:
        raise UsageError(f"service must be a URL, None or False, got {type(service).__name__}")
    url = service if isinstance(service, str) else os.environ.get(SERVICE_URL_ENV, "")
    if not url.strip():
        return None
    interval = _heartbeat_interval()
    reporter = JobReporter(url.strip(), os.environ.get(TOKEN_ENV) or None, loader, interval=interval)
    reporter.start()
    return reporter


def _heartbeat_interval() -> float:
    text = os.environ.get(HEARTBEAT_ENV, "").strip()
    try:
        return min(600.0, max(0.05, float(text))) if text else DEFAULT_HEARTBEAT_S
    except ValueError:
        _log.warning("ferry jobs: $%s is not a number of seconds (%r): heartbeating every %s s", HEARTBEAT_ENV,
                     text[:40], DEFAULT_HEARTBEAT_S)  # fmt: skip
        return DEFAULT_HEARTBEAT_S


def _job_name() -> str:
    """``$FERRY_JOB_NAME``, else torchrun's run id, else host-pid (letters, digits and ``._-`` only)."""
    raw = os.environ.get(NAME_ENV) or os.environ.get("TORCHELASTIC_RUN_ID") or f"{socket.gethostname()}-{os.getpid()}"
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in raw).strip(".-_")[:128]
    return (name or "job").replace("..", ".")


def registration_of(loader: Any, name: str, heartbeat_s: float) -> Registration:
    """The read plan of ``loader``: each dataset with its version and order, the mixture's phases, the shape."""
    ds = loader.dataset
    sources = list(getattr(ds, "sources", None) or [ds])
    schedule = getattr(ds, "schedule", None)
    phases = [JobPhase(int(s), [int(x) for x in q]) for s, q in schedule.phases] if schedule else [JobPhase(0, [1])]
    plans = []
    for src in sources:
        ident = src.identity()
        eras = src.record().get("eras", [])
        plans.append(
            SourcePlan(
                urls=[str(u) for u in src.replicas.names],
                version=str(ident["dataset_version"]),
                seed=str(int(ident["seed"])),
                shuffle=str(ident["shuffle"]),
                window=int(getattr(src, "window", 1)),
                mode=str(ident["mode"]),
                seq_len=int(ident["seq_len"]),
                eras=[JobEra(str(v), int(n), int(k), int(e)) for v, n, k, e in eras],
            )  # fmt: skip
        )
    return Registration(
        name=name, rank=int(loader.rank), world_size=int(loader.world_size), batch_size=int(loader.batch_size),
        sources=plans, phases=phases, host=socket.gethostname()[:255], pid=os.getpid(), heartbeat_s=heartbeat_s,
    )  # fmt: skip


def stats_of(summary: dict[str, Any]) -> JobStats:
    """The heartbeat's share of ``loader.stats()``."""
    replicas = summary.get("replicas", {})
    p50 = [r["latency_p50_s"] for r in replicas.values() if r.get("latency_p50_s") is not None]
    p99 = [r["latency_p99_s"] for r in replicas.values() if r.get("latency_p99_s") is not None]
    return JobStats(
        stall_share=min(1.0, max(0.0, float(summary.get("stall_share", 0.0)))),
        stall_s=float(summary.get("stall_s", 0.0)), wall_s=float(summary.get("wall_s", 0.0)),
        batches=int(summary.get("batches", 0)), delivered_bytes=int(summary.get("delivered_bytes", 0)),
        cache_hits=int(summary.get("cache_hits", 0)), cache_misses=int(summary.get("cache_misses", 0)),
        fetch_p50_s=_finite(max(p50)) if p50 else None, fetch_p99_s=_finite(max(p99)) if p99 else None,
        replica_bytes={str(u): int(r.get("bytes", 0)) for u, r in list(replicas.items())[:64]},
    )  # fmt: skip


def _no_reporter() -> None:
    return None


def _finite(x: float) -> float | None:
    return x if x != float("inf") else None


class JobReporter:
    """The background thread that registers one loader and heartbeats it until the loader goes or ``stop()``."""

    def __init__(
        self,
        url: str,
        token: str | None,
        loader: Any,
        *,
        interval: float = DEFAULT_HEARTBEAT_S,
        timeout: float = REQUEST_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.interval = interval
        self.job_id: str | None = None
        self.sent = 0  # heartbeats the daemon accepted
        self._loader = weakref.ref(loader)
        self._name = _job_name()
        headers = {"User-Agent": "ferry-loader", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._plan: Registration | None = None
        self._last: tuple[float, int] | None = None  # (time, position) of the previous heartbeat
        self._complained: set[str] = set()

    def __repr__(self) -> str:  # never the token
        return f"JobReporter({self.url!r}, job={self.job_id})"

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """A copied or pickled loader does not report: only the loader that started this thread does."""
        return _no_reporter, ()

    def start(self) -> None:
        self._thread = start_named_thread(self._run, name="ferry-jobs", daemon=True)

    def stop(self, timeout: float = 0.0) -> None:
        """End the thread (it tells the daemon the job left, best-effort); waits at most ``timeout`` for it."""
        self._stop.set()
        if self._thread is not None and timeout > 0:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._tick():
                    break
                self._stop.wait(self.interval)
            self._leave()
        finally:
            self._http.close()

    def _tick(self) -> bool:
        """One registration or heartbeat; False once the loader is gone."""
        loader = self._loader()
        if loader is None:
            return False
        try:
            plan = registration_of(loader, self._name, self.interval)
            beat = self._heartbeat(loader, plan)
        except Exception as exc:  # noqa: BLE001 — reading the loader must never break the reporter
            self._complain("plan", f"cannot describe the loader: {exc}")
            return True
        del loader  # never keep the loader alive across the wait
        try:
            if self.job_id is None:
                self._register(plan)
            elif plan != self._plan:  # a loaded state re-planned the run: the new plan rides on the heartbeat
                if self._send(dataclasses.replace(beat, registration=plan)):
                    self._plan = plan
            else:
                self._send(beat)
        except httpx.HTTPError as exc:
            self._complain("net", f"daemon at {self.url} unreachable ({type(exc).__name__}); retrying")
        return True

    def _heartbeat(self, loader: Any, plan: Registration) -> Heartbeat:
        now, position = time.monotonic(), int(loader.position)
        rate = 0.0
        if self._last is not None and now > self._last[0]:
            rate = max(0.0, (position - self._last[1]) / (now - self._last[0]))
        self._last = (now, position)
        return Heartbeat(position=position, epoch=int(loader.epoch), samples_per_second=rate,
                         stats=stats_of(loader.stats()))  # fmt: skip

    def _register(self, plan: Registration) -> bool:
        r = self._http.post("/api/v1/jobs", json=dataclasses.asdict(plan))
        if r.status_code != 201:
            reason = f"daemon refused the registration: {r.status_code} {r.text[:200]}"
            self._complain(f"register-{r.status_code}", reason)
            return False
        self.job_id = str(r.json()["id"])
        self._plan = plan
        self._complained.clear()
        return True

    def _send(self, beat: Heartbeat) -> bool:
        r = self._http.put(f"/api/v1/jobs/{self.job_id}", json=dataclasses.asdict(beat))
        if r.status_code == 404:  # expired (the daemon restarted, or we were away too long): register anew
            self.job_id = None
            return False
        if r.status_code >= 400:
            self._complain(f"beat-{r.status_code}", f"daemon refused a heartbeat: {r.status_code} {r.text[:200]}")
            return False
        self.sent += 1
        return True

    def _leave(self) -> None:
        if self.job_id is None:
            return
        with contextlib.suppress(httpx.HTTPError):  # else it expires by itself
            self._http.delete(f"/api/v1/jobs/{self.job_id}", timeout=0.5)
        self.job_id = None

    def _complain(self, key: str, message: str) -> None:
        if key not in self._complained:  # once per kind of trouble, not once per heartbeat
            self._complained.add(key)
            _log.warning("ferry jobs: %s", message)
