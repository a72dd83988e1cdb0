"""An ASGI shortcut for the hot polling reads: cached JSON bytes without FastAPI's per-request machinery.

Dashboards and ``ferry status`` poll ``/api/v1/replicas`` and friends; answering those from the
response cache straight at the ASGI layer costs a fraction of a full FastAPI dispatch. Anything
else (a query string, a missing or wrong token, other paths and methods) falls through to the
app, which stays the single definition of behaviour and of the OpenAPI schema.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from .cache import ResponseCache

__all__ = ["CachedReads"]

Producer = Callable[[], BaseModel | Sequence[BaseModel]]


class CachedReads:
    """ASGI middleware serving ``GET path`` (no query) from ``cache`` for the paths in ``routes``."""

    def __init__(self, app: Any, cache: ResponseCache, routes: Mapping[str, Producer], token: str | None) -> None:
        self.app = app
        self._cache = cache
        self._routes = dict(routes)
        self._auth = f"Bearer {token}".encode() if token else None  # None: reads are open

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        produce = self._routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if produce is None or scope["method"] != "GET" or scope.get("query_string") or not self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = self._cache.get(scope["path"], produce)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: dict[str, Any]) -> bool:
        if self._auth is None:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                return hmac.compare_digest(value, self._auth)  # a mismatch falls through to the app's 401/403
        return False
