"""The FastAPI application: JSON API under /api/v1, SSE, /metrics, health, and the dashboard at /."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client.registry import Collector

from ferry.shard_tools.errors import NotFoundError, UsageError

from ..config import ApiConfig
from ..jobs.registry import JobRegistry
from .auth import NAME_PATTERN, check_token, valid_name
from .backend import ApiBackend
from .fastpath import CachedReads, FastReadsApp
from .guard import MAX_BODY_BYTES, RequestGuard
from .job_metrics import JobCollector
from .jobs import job_routes
from .metrics import CONTENT_TYPE, render_metrics
from .models import (
    ActionResult,
    ClusterOut,
    DatasetDetail,
    DatasetSummary,
    ErrorEntry,
    HealthOut,
    HistoryEntry,
    LimitsIn,
    LimitsOut,
    LinkOut,
    ReplicaMatrix,
    RetryIn,
    ScrubIn,
    StatusOut,
    SyncIn,
    ThroughputOut,
    TransferOut,
)
from .response_cache import ResponseCache
from .settings import api_config_of, resolve_token
from .sse import event_stream

__all__ = ["create_app"]

_STATIC = resources.files("ferry.service") / "static"
_STATIC_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
_NO_STORE = {"Cache-Control": "no-store"}
# Events that only move counters (bytes, verified shards) many times a second during a sync: they
# leave cached reads alone, which then trail them by at most the cache's TTL. Any other event
# (an error, a publish, the end of a pass, a control call) drops the cache at once.
_COUNTING_EVENTS = frozenset({"progress", "shard_verified"})
# A validation error's location is echoed only where it names a field or a short plain key; anything
# else a client chose (a 60 KiB key, control characters) is shown as this placeholder.
_PLAIN_LOC = re.compile(r"[A-Za-z0-9_.>-]{1,64}")
_HIDDEN_LOC = "<key>"
_FAVICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#1f6feb"/>'
    b'<path d="M3 10h10l-2 3H5z M7 3v6h1V5l3 4H7" fill="#fff"/></svg>'
)


def create_app(daemon: Any, api_config: Any = None) -> FastAPI:
    """Build the app over a daemon (a ``ferry.service.daemon.Daemon`` or anything implementing ``ApiBackend``)."""
    settings = api_config_of(api_config)
    token = resolve_token(settings)
    backend: ApiBackend = _as_backend(daemon, settings)
    stopping = asyncio.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        stopping.set()  # ends open SSE streams so shutdown is not held up
        app.state.unsubscribe()
        close = getattr(backend, "close", None)
        if close is not None:  # the adapter's event pump and sampler threads
            close()

    app = FastReadsApp(
        title="ferry service",
        version="1",
        description="Replication status and control. Mutating calls need `Authorization: Bearer <token>`.",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI loads its assets from a CDN; ferry works offline, the schema is enough
        redoc_url=None,
        openapi_url="/api/v1/openapi.json",
    )
    cache = ResponseCache(ttl=0.25)
    app.state.backend = backend
    app.state.unsubscribe = backend.subscribe(lambda ev: None if ev.kind in _COUNTING_EVENTS else cache.clear())
    app.state.settings = settings
    app.state.stopping = stopping
    read_access = _read_access(settings, token)
    read = APIRouter(
        prefix="/api/v1",
        dependencies=[Depends(read_access)],
        responses=_401_403 if settings.read_protected else None,
    )
    _status_routes(read, backend, cache)
    _activity_routes(read, backend, cache, stopping, settings.max_event_streams)
    app.include_router(read)
    app.include_router(_write_routes(backend, cache, token))
    app.state.jobs = _job_registry(daemon, backend)
    for router in job_routes(app.state.jobs, token, read_access):
        app.include_router(router)
    # token and body size are checked from the headers, before FastAPI reads (and parses) any body
    app.add_middleware(RequestGuard, token=token, read_protected=settings.read_protected)
    app.fast_reads = CachedReads(
        cache,
        routes={
            "/api/v1/status": backend.status,
            "/api/v1/replicas": backend.replicas,
            "/api/v1/transfers": backend.transfers,
            "/api/v1/clusters": backend.clusters,
            "/api/v1/datasets": backend.datasets,
            "/api/v1/links": backend.links,
            "/api/v1/limits": backend.limits,
        },
        token=token if settings.read_protected else None,
    )
    _error_handlers(app)
    _site_routes(app, backend, read_access, [JobCollector(app.state.jobs.jobs, app.state.jobs.missing)])
    app.state.started = time.time()
    return app


_401_403: dict[int | str, dict[str, Any]] = {
    401: {"description": "no bearer token"},
    403: {"description": "bad token"},
}
_404: dict[int | str, dict[str, Any]] = {404: {"description": "unknown dataset, cluster, link or error id"}}


def _read_access(settings: ApiConfig, token: str | None) -> Callable[[Request], None]:
    """The dependency of every read: the token, where reads are protected."""

    def read_access(request: Request) -> None:
        if settings.read_protected:
            check_token(request, token)

    return read_access


def _status_routes(read: APIRouter, backend: ApiBackend, cache: ResponseCache) -> None:
    """What is replicated where: status, clusters, datasets, the replica matrix, transfers in flight."""

    @read.get("/status", response_model=StatusOut, summary="Daemon state: paused, limits, counters")
    async def get_status() -> Response:
        return _json(cache.get("/api/v1/status", backend.status))

    @read.get("/clusters", response_model=list[ClusterOut], summary="Configured clusters")
    async def get_clusters() -> Response:
        return _json(cache.get("/api/v1/clusters", backend.clusters))

    @read.get("/datasets", response_model=list[DatasetSummary], summary="Replicated datasets")
    async def get_datasets() -> Response:
        return _json(cache.get("/api/v1/datasets", backend.datasets))

    @read.get(
        "/datasets/{name}",
        response_model=DatasetDetail,
        summary="One dataset: versions, shards, completeness per cluster",
        responses={404: {"description": "unknown dataset"}},
    )
    def get_dataset(name: Annotated[str, Path(pattern=NAME_PATTERN, max_length=128)]) -> DatasetDetail:
        if not valid_name(name):
            raise RequestValidationError(
                [{"loc": ("path", "name"), "msg": "invalid dataset name", "type": "value_error"}]
            )
        return backend.dataset(name, 0)  # an unknown name: NotFoundError, the 404 below with its message

    @read.get("/replicas", response_model=ReplicaMatrix, summary="Dataset × cluster completeness matrix")
    async def get_replicas() -> Response:
        return _json(cache.get("/api/v1/replicas", backend.replicas))

    @read.get("/transfers", response_model=list[TransferOut], summary="Shard copies in flight")
    async def get_transfers() -> Response:
        return _json(cache.get("/api/v1/transfers", backend.transfers))


def _activity_routes(
    read: APIRouter, backend: ApiBackend, cache: ResponseCache, stopping: asyncio.Event, max_streams: int
) -> None:
    """What happened and how fast: history, errors, links, throughput, limits, the event stream."""
    open_streams = 0

    async def counted(frames: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
        nonlocal open_streams
        open_streams += 1
        try:
            async for frame in frames:
                yield frame
        finally:
            open_streams -= 1
            await frames.aclose()  # its own finally (unsubscribe) runs now, not at garbage collection

    @read.get("/history", response_model=list[HistoryEntry], summary="Finished transfers, newest first")
    def get_history(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        dataset: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None,
    ) -> list[HistoryEntry]:
        return backend.history(limit, dataset)

    @read.get("/errors", response_model=list[ErrorEntry], summary="Open replication errors, newest first")
    async def get_errors(limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
        return _json(cache.get(f"errors:{limit}", lambda: backend.errors(limit)))

    @read.get("/links", response_model=list[LinkOut], summary="Lag, SLA attainment and limits per link")
    async def get_links() -> Response:
        return _json(cache.get("/api/v1/links", backend.links))

    @read.get("/throughput", response_model=ThroughputOut, summary="Copy throughput over the recent past")
    def get_throughput(
        seconds: Annotated[float, Query(ge=10, le=3600)] = 3600,
        buckets: Annotated[int, Query(ge=1, le=720)] = 120,
    ) -> ThroughputOut:
        return backend.throughput(seconds, buckets)

    @read.get("/limits", response_model=LimitsOut, summary="Current transfer and bandwidth limits")
    async def get_limits() -> Response:
        return _json(cache.get("/api/v1/limits", backend.limits))

    @read.get(
        "/events",
        summary="Server-Sent Events: hello, progress, shard_verified, version_published, error, scrub, state, pass",
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
            503: {"description": "as many event streams open as [api] max_event_streams allows"},
        },
    )
    async def get_events(request: Request) -> StreamingResponse:
        if open_streams >= max_streams:  # each stream costs the daemon's threads on every event
            raise HTTPException(503, f"{open_streams} event streams open (the most): retry shortly",
                                headers={"Retry-After": "5"})  # fmt: skip
        return StreamingResponse(
            counted(event_stream(backend, request.is_disconnected, stopping)),
            media_type="text/event-stream",
            headers={**_NO_STORE, "X-Accel-Buffering": "no"},
        )


def _write_routes(backend: ApiBackend, cache: ResponseCache, token: str | None) -> APIRouter:
    """The control calls; each needs the token and drops the read cache."""

    def write_access(request: Request) -> None:
        check_token(request, token)

    write = APIRouter(
        prefix="/api/v1",
        dependencies=[Depends(write_access)],
        responses={**_401_403, 413: {"description": f"request body over {MAX_BODY_BYTES} bytes"}},
    )

    @write.post(
        "/sync", response_model=ActionResult, summary="Sync now (all, one dataset and/or one link)", responses=_404
    )
    def post_sync(body: SyncIn | None = None) -> ActionResult:
        result = backend.sync(body or SyncIn())
        cache.clear()
        return result

    @write.post(
        "/pause",
        response_model=ActionResult,
        summary="Pause replication: no new transfers start (those in flight finish)",
    )
    def post_pause() -> ActionResult:
        result = backend.pause()
        cache.clear()
        return result

    @write.post("/resume", response_model=ActionResult, summary="Resume replication")
    def post_resume() -> ActionResult:
        result = backend.resume()
        cache.clear()
        return result

    @write.put(
        "/limits", response_model=LimitsOut, summary="Change transfer and bandwidth limits at run time", responses=_404
    )
    def put_limits(body: LimitsIn) -> LimitsOut:
        result = backend.set_limits(body)
        cache.clear()
        return result

    @write.post(
        "/scrub",
        response_model=ActionResult,
        summary="Re-verify replicas and repair from a healthy copy",
        responses=_404,
    )
    def post_scrub(body: ScrubIn | None = None) -> ActionResult:
        result = backend.scrub(body or ScrubIn())
        cache.clear()
        return result

    @write.post(
        "/retry", response_model=ActionResult, summary="Retry one failed shard (by error id) or all", responses=_404
    )
    def post_retry(body: RetryIn | None = None) -> ActionResult:
        result = backend.retry(body or RetryIn())
        cache.clear()
        return result

    return write


def _error_handlers(app: FastAPI) -> None:
    """404 for unknown names, 422 (FastAPI's own shape) for refused values."""

    @app.exception_handler(NotFoundError)
    async def not_found(request: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(RequestValidationError)
    async def validation_failed(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_detail(exc.errors())}, status_code=422)

    @app.exception_handler(UsageError)  # a refused value (Invalid too); a NotFoundError is the 404 above
    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        # shaped like FastAPI's own 422 body, so one schema (HTTPValidationError) describes every 422
        return JSONResponse({"detail": [{"loc": ["body"], "msg": str(exc), "type": "value_error"}]}, status_code=422)


def _site_routes(
    app: FastAPI, backend: ApiBackend, read_access: Callable[[Request], None], collectors: list[Collector]
) -> None:
    """/metrics, health probes, and the dashboard's page and static files."""

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response, dependencies=[Depends(read_access)])
    def metrics() -> Response:
        return Response(render_metrics(backend, collectors), media_type=CONTENT_TYPE)

    @app.get("/healthz", response_model=HealthOut, summary="Liveness")
    def healthz() -> HealthOut:
        return HealthOut(status="ok")

    @app.get(
        "/readyz", response_model=HealthOut, summary="Readiness (daemon started)", responses={503: {"model": HealthOut}}
    )
    def readyz() -> Any:
        if backend.ready():
            return HealthOut(status="ok")
        return JSONResponse(HealthOut(status="starting").model_dump(), status_code=503)

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(_static_bytes("index.html"), media_type="text/html; charset=utf-8", headers=_NO_STORE)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(_FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    @app.get("/static/{fname}", include_in_schema=False)
    def static(fname: str) -> Response:
        if fname not in _STATIC_FILES:  # fixed allow-list: no path ever reaches the filesystem
            raise HTTPException(404, "not found")
        return Response(_static_bytes(fname), media_type=_STATIC_FILES[fname] + "; charset=utf-8", headers=_NO_STORE)


def _validation_detail(errors: Any) -> list[dict[str, Any]]:
    """FastAPI's 422 items cut to ``loc``, ``msg`` and ``type``: never the input, its context or the body."""
    out = []
    for err in errors:
        loc = [p if isinstance(p, int) or _PLAIN_LOC.fullmatch(str(p)) else _HIDDEN_LOC for p in err.get("loc", ())]
        out.append({"loc": loc, "msg": str(err.get("msg", "invalid value"))[:200], "type": str(err.get("type", ""))})
    return out


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _static_bytes(name: str) -> bytes:
    return (_STATIC / name).read_bytes()


def _job_registry(daemon: Any, backend: ApiBackend) -> JobRegistry:
    """The daemon's registry of jobs (the one its staging reads), else one of the API's own."""
    registry = getattr(daemon, "jobs", None)
    if isinstance(registry, JobRegistry):
        return registry
    return JobRegistry(lambda: [(c.name, c.url) for c in backend.clusters()])


def _as_backend(daemon: Any, settings: ApiConfig) -> ApiBackend:
    if hasattr(daemon, "replicas") and hasattr(daemon, "copied_bytes"):
        return daemon  # already an ApiBackend
    from .daemon_backend import DaemonBackend

    return DaemonBackend(daemon, settings)
