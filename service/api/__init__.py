"""The service's HTTP face: FastAPI app (JSON API, SSE, /metrics, dashboard) and its uvicorn server."""

from __future__ import annotations

from .app import create_app
from .backend import ApiBackend
from .server import RunningServer, run_server, start_server
from .settings import ApiSettings

__all__ = ["ApiBackend", "ApiSettings", "RunningServer", "create_app", "run_server", "start_server"]
