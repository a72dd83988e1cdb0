"""The API's front door: the bearer token and the body size are checked before a body byte is read.

FastAPI reads and parses a request body before it runs the route's dependencies, so a token
check in a dependency lets anyone make the server buffer and parse whatever they send. This
pure-ASGI middleware looks only at the request line and headers: a request that needs the token
and lacks it is answered 401/403 at once, a declared ``Content-Length`` over the limit 413 at
once, and a streamed (chunked) body is counted as the app reads it, 413 as soon as it passes the
limit. A refused request that still has a body to send gets ``Connection: close``, so the server
does not go on reading it.
"""

from __future__ import annotations

from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import check_token

__all__ = ["MAX_BODY_BYTES", "BodyTooLarge", "RequestGuard"]

#: The largest request body the API accepts; its largest real body (limits for 256 links) is ~20 KiB.
MAX_BODY_BYTES = 64 * 1024
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_API_PREFIX = "/api/v1/"
_OPEN_API_PATHS = frozenset({"/api/v1/openapi.json"})  # the schema is public, like the page that uses it


class BodyTooLarge(HTTPException):
    """413: the request body is over ``limit`` bytes (raised while the body is read, answered by the app)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"request body over {limit} bytes: the ferry API accepts at most {limit // 1024} KiB",
            headers={"Connection": "close"},
        )


class RequestGuard:
    """Token check (every mutating ``/api/v1`` call; reads too when ``read_protected``) and body size cap."""

    def __init__(
        self, app: ASGIApp, *, token: str | None, read_protected: bool, max_body: int = MAX_BODY_BYTES
    ) -> None:
        self.app = app
        self._token = token
        self._read_protected = read_protected
        self._max = max_body

    def needs_token(self, method: str, path: str) -> bool:
        """True for control calls (any non-read method under /api/v1) and, when protected, for reads."""
        if path.startswith(_API_PREFIX) and path not in _OPEN_API_PATHS:
            return self._read_protected or method not in _SAFE_METHODS
        return self._read_protected and path == "/metrics"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = _content_length(headers)
        pending_body = "transfer-encoding" in headers or bool(length)
        if self.needs_token(scope["method"], scope["path"]):
            try:
                check_token(Request(scope), self._token)  # reads headers only
            except HTTPException as exc:
                await _refuse(exc, pending_body, scope, receive, send)
                return
        if length is not None and length > self._max:
            await _refuse(BodyTooLarge(self._max), True, scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max:  # FastAPI re-raises HTTPExceptions from body reading: the app answers 413
                    raise BodyTooLarge(self._max)
            return message

        return counted


def _content_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:  # the HTTP parser refuses these before we see them; be safe anyway
        return None


async def _refuse(exc: HTTPException, close: bool, scope: Scope, receive: Receive, send: Send) -> None:
    headers = dict(exc.headers or {})
    if close:
        headers["Connection"] = "close"
    response = JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)
    await response(scope, receive, send)
