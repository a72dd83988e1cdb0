"""A shortcut for the hot polling reads: cached JSON bytes without FastAPI's per-request machinery.

Dashboards and ``ferry status`` poll ``/api/v1/replicas`` and friends; answering those from the
response cache ahead of every middleware (FastAPI's telemetry and body-limit layers, Starlette's
error layer, routing, dependencies) costs a fraction of a full dispatch, and that time comes
out of the interpreter the replication threads share. Anything else (a query string, a missing
or wrong token, other paths and methods) goes to the app, which stays the single definition of
behaviour and of the OpenAPI schema.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI

from .response_cache import ResponseCache

__all__ = ["CachedReads", "FastReadsApp"]

Producer = Callable[[], Any]  # a response model or a list of them (dump_json)


class CachedReads:
    """Answers ``GET path`` (no query) from ``cache`` for the paths in ``routes``."""

    def __init__(self, cache: ResponseCache, routes: Mapping[str, Producer], token: str | None) -> None:
        self._cache = cache
        self._routes = dict(routes)
        self._auth = f"Bearer {token}".encode() if token else None  # None: reads are open
        self.answered = 0  # requests answered here, ahead of the app (for operators' curiosity and the tests)

    async def answer(self, scope: dict[str, Any], send: Any) -> bool:
        """Send the cached response and return True, or return False (nothing sent) for the app to answer."""
        produce = self._routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if produce is None or scope["method"] != "GET" or scope.get("query_string") or not self._allowed(scope):
            return False
        body = self._cache.get(scope["path"], produce)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
        self.answered += 1
        return True

    def _allowed(self, scope: dict[str, Any]) -> bool:
        if self._auth is None:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                return hmac.compare_digest(value, self._auth)  # a mismatch goes to the app's 401/403
        return False


class FastReadsApp(FastAPI):
    """FastAPI with ``fast_reads`` (a ``CachedReads``) tried first, outside every middleware."""

    fast_reads: CachedReads | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.fast_reads is not None and await self.fast_reads.answer(scope, send):
            return
        await super().__call__(scope, receive, send)
