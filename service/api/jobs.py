"""``/api/v1/jobs``: loaders register their read plans and heartbeat; anyone who may read lists them.

Registering, heartbeating and leaving are control calls (the bearer token, as every mutating call);
listing is a read. The routes are thin: ``ferry.service.jobs.registry`` owns the jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response

from ferry.client.service.job_types import Heartbeat, JobAck, Registration
from ferry.client.service.service_types import from_json

from ..jobs.registry import JobRegistry, RegistryFull
from .auth import check_token
from .job_models import HeartbeatIn, JobAckOut, JobOut, RegistrationIn

__all__ = ["job_routes"]

_ID = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$", description="the id the registration returned")]
_401_403: dict[int | str, dict[str, Any]] = {401: {"description": "no bearer token"}, 403: {"description": "bad token"}}
_404: dict[int | str, dict[str, Any]] = {404: {"description": "no such job (it expired: register again)"}}


def job_routes(registry: JobRegistry, token: str | None, read_access: Callable[[Request], None]) -> list[APIRouter]:
    """The read router (listing) and the write router (register, heartbeat, leave)."""

    def write_access(request: Request) -> None:
        check_token(request, token)

    read = APIRouter(prefix="/api/v1", dependencies=[Depends(read_access)], tags=["jobs"])
    write = APIRouter(prefix="/api/v1", dependencies=[Depends(write_access)], responses=_401_403, tags=["jobs"])

    @read.get("/jobs", response_model=list[JobOut], summary="Registered training jobs (one entry per rank)")
    def get_jobs() -> list[Any]:
        return registry.jobs()

    @read.get("/jobs/{job_id}", response_model=JobOut, summary="One registered job", responses=_404)
    def get_job(job_id: _ID) -> Any:
        return registry.job(job_id)

    @write.post(
        "/jobs",
        response_model=JobAckOut,
        status_code=201,
        summary="Register a loader's read plan (it heartbeats from then on)",
        responses={503: {"description": "as many jobs registered as the daemon keeps"}},
    )
    def post_job(body: RegistrationIn) -> JobAck:
        try:
            job = registry.register(from_json(Registration, _dump(body)))
        except RegistryFull as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "30"}) from None
        return JobAck(job.id, job.expires_at() - job.last_seen)

    @write.put("/jobs/{job_id}", response_model=JobAckOut, summary="Heartbeat: where the job stands", responses=_404)
    def put_job(job_id: _ID, body: HeartbeatIn) -> JobAck:
        job = registry.heartbeat(job_id, from_json(Heartbeat, _dump(body)))
        return JobAck(job.id, job.expires_at() - job.last_seen)

    @write.delete("/jobs/{job_id}", status_code=204, summary="The loader closed: forget the job", responses=_404)
    def delete_job(job_id: _ID) -> Response:
        registry.remove(job_id)
        return Response(status_code=204)

    return [read, write]


def _dump(body: Any) -> Any:
    """A validated request model as plain JSON data (to a type checker the model is its record)."""
    return body.model_dump()
