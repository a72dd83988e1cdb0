"""``ServiceClient``: typed access to the ferry service's HTTP API over httpx.

Every method maps to one endpoint; errors become ``ferry.shard_tools.errors.ServiceError`` with the
HTTP status (0 when the server cannot be reached). The transport is injectable
(``httpx.MockTransport``, ``httpx.ASGITransport``…) so tests drive the real client.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ferry.shard_tools.errors import ServiceError

from .job_types import Job
from .service_types import (
    ActionResult,
    Cluster,
    DatasetDetail,
    DatasetSummary,
    ErrorEntry,
    Event,
    HistoryEntry,
    Limits,
    Link,
    ReplicaMatrix,
    Status,
    Throughput,
    Transfer,
    from_json,
)

__all__ = ["ServiceClient", "DEFAULT_SERVER"]

#: Where ``ferry status`` looks when no ``--server`` is given (env ``FERRY_SERVER`` overrides).
DEFAULT_SERVER = "http://127.0.0.1:8765"

T = TypeVar("T")


class ServiceClient:
    """Client of one ferry service. ``token`` is sent as a bearer token (needed for control calls)."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        *,
        timeout: float = 10.0,
    ) -> None:
        self.base_url = (base_url or os.environ.get("FERRY_SERVER") or DEFAULT_SERVER).rstrip("/")
        headers = {"Accept": "application/json", "User-Agent": "ferry-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, transport=transport, timeout=timeout)

    def __repr__(self) -> str:  # never show the token
        return f"ServiceClient({self.base_url!r})"

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing --------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        try:
            r = self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot reach the ferry service at {self.base_url}: {exc}", status=0) from exc
        if r.status_code >= 400:
            raise ServiceError(f"{method} {path}: {r.status_code} {_detail(r)}", status=r.status_code)
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text

    def _get(self, cls: type[T], path: str, params: dict[str, Any] | None = None) -> T:
        return from_json(cls, self._request("GET", path, params=params))

    def _list(self, cls: type[T], path: str, params: dict[str, Any] | None = None) -> list[T]:
        return [from_json(cls, item) for item in self._request("GET", path, params=params)]

    # ---- reading ---------------------------------------------------------------------------------------------

    def status(self) -> Status:
        """Paused, limits and counters."""
        return self._get(Status, "/api/v1/status")

    def clusters(self) -> list[Cluster]:
        """Configured clusters (URLs without credentials)."""
        return self._list(Cluster, "/api/v1/clusters")

    def datasets(self) -> list[DatasetSummary]:
        """Replicated datasets as their sources publish them."""
        return self._list(DatasetSummary, "/api/v1/datasets")

    def dataset(self, name: str) -> DatasetDetail:
        """One dataset with its versions and completeness per cluster (ServiceError 404 if unknown)."""
        return self._get(DatasetDetail, f"/api/v1/datasets/{quote(name, safe='')}")

    def replicas(self) -> ReplicaMatrix:
        """The dataset × cluster completeness matrix."""
        return self._get(ReplicaMatrix, "/api/v1/replicas")

    def transfers(self) -> list[Transfer]:
        """Shard copies in flight."""
        return self._list(Transfer, "/api/v1/transfers")

    def history(self, limit: int = 100, dataset: str | None = None) -> list[HistoryEntry]:
        """Finished transfers, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if dataset is not None:
            params["dataset"] = dataset
        return self._list(HistoryEntry, "/api/v1/history", params)

    def errors(self, limit: int = 100) -> list[ErrorEntry]:
        """Open replication errors, newest first."""
        return self._list(ErrorEntry, "/api/v1/errors", {"limit": limit})

    def links(self) -> list[Link]:
        """Lag, SLA attainment, rate and limit per source → destination link."""
        return self._list(Link, "/api/v1/links")

    def throughput(self, seconds: float = 3600, buckets: int = 120) -> Throughput:
        """Copy throughput over the last ``seconds``, in ``buckets`` points."""
        return self._get(Throughput, "/api/v1/throughput", {"seconds": seconds, "buckets": buckets})

    def jobs(self) -> list[Job]:
        """Registered training jobs (one entry per rank), with where each stands and its stall share."""
        return self._list(Job, "/api/v1/jobs")

    def limits(self) -> Limits:
        """Current transfer and bandwidth limits."""
        return self._get(Limits, "/api/v1/limits")

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return str(self._request("GET", "/metrics"))

    def healthy(self) -> bool:
        """True when ``/healthz`` answers 200."""
        try:
            self._request("GET", "/healthz")
        except ServiceError:
            return False
        return True

    def ready(self) -> bool:
        """True when ``/readyz`` answers 200 (the daemon is running)."""
        try:
            self._request("GET", "/readyz")
        except ServiceError:
            return False
        return True

    def events(self, *, max_events: int | None = None, timeout: float | None = None) -> Iterator[Event]:
        """Follow ``/api/v1/events``; stops after ``max_events`` events or when the stream ends.

        ``timeout`` bounds the wait for each chunk (keep-alives arrive every 15 s); None waits forever.
        """
        count = 0
        try:
            with self._http.stream(
                "GET", "/api/v1/events", headers={"Accept": "text/event-stream"}, timeout=httpx.Timeout(timeout)
            ) as r:
                if r.status_code >= 400:
                    r.read()
                    raise ServiceError(f"GET /api/v1/events: {r.status_code} {_detail(r)}", status=r.status_code)
                for ev in _parse_sse(r.iter_lines()):
                    yield ev
                    count += 1
                    if max_events is not None and count >= max_events:
                        return
        except httpx.HTTPError as exc:
            raise ServiceError(f"event stream from {self.base_url} failed: {exc}", status=0) from exc

    # ---- control (need the token) ----------------------------------------------------------------------------

    def sync(
        self, dataset: str | None = None, source: str | None = None, destination: str | None = None
    ) -> ActionResult:
        """Queue a sync pass now: everything, one dataset and/or one link (``source`` and ``destination``)."""
        body = {k: v for k, v in (("dataset", dataset), ("source", source), ("destination", destination)) if v}
        return from_json(ActionResult, self._request("POST", "/api/v1/sync", body=body))

    def pause(self) -> ActionResult:
        """Pause replication: no new transfers start."""
        return from_json(ActionResult, self._request("POST", "/api/v1/pause"))

    def resume(self) -> ActionResult:
        """Resume replication."""
        return from_json(ActionResult, self._request("POST", "/api/v1/resume"))

    def set_limits(
        self,
        *,
        global_bps: float | None = None,
        links: dict[str, float] | None = None,
        transfers: int | None = None,
    ) -> Limits:
        """Change limits at run time; bandwidth in bytes/s, ``0`` = unlimited, omitted = unchanged."""
        body: dict[str, Any] = {}
        if global_bps is not None:
            body["global_bps"] = global_bps
        if links is not None:
            body["links"] = links
        if transfers is not None:
            body["transfers"] = transfers
        return from_json(Limits, self._request("PUT", "/api/v1/limits", body=body))

    def scrub(self, dataset: str | None = None, cluster: str | None = None) -> ActionResult:
        """Queue a scrub: re-verify replicas and repair from a healthy copy."""
        body = {k: v for k, v in (("dataset", dataset), ("cluster", cluster)) if v}
        return from_json(ActionResult, self._request("POST", "/api/v1/scrub", body=body))

    def retry(self, error_id: int | None = None) -> ActionResult:
        """Retry one failed shard by error id, or every open error."""
        body = {} if error_id is None else {"id": error_id}
        return from_json(ActionResult, self._request("POST", "/api/v1/retry", body=body))


def _detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail", "")
    except (ValueError, AttributeError):
        return r.text[:200]
    if isinstance(detail, list):  # FastAPI validation errors: keep the messages
        return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)[:300]
    return detail if isinstance(detail, str) else json.dumps(detail)[:300]


def _parse_sse(lines: Iterator[str]) -> Iterator[Event]:
    kind, data, ev_id = "message", "", None
    for line in lines:
        if line == "":
            if data:
                yield Event(kind=kind, data=json.loads(data), id=ev_id)
            kind, data, ev_id = "message", "", None
        elif line.startswith(":"):
            continue  # keep-alive comment
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif line.startswith("id:"):
            ev_id = int(line[3:].strip()) if line[3:].strip().isdigit() else None
