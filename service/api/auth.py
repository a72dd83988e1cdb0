"""Bearer-token checks (constant-time) and name validation for path and query parameters."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request

from ..names import NAME_MAX_LENGTH, NAME_PATTERN, valid_name

__all__ = ["NAME_PATTERN", "NAME_MAX_LENGTH", "check_token", "valid_name"]


def check_token(request: Request, expected: str | None) -> None:
    """Raise 401 when no bearer token is sent, 403 when it is wrong or control is disabled (no token set)."""
    header = request.headers.get("authorization", "")
    scheme, _, supplied = header.partition(" ")
    if scheme.lower() != "bearer" or not supplied.strip():
        raise HTTPException(401, "bearer token required", headers={"WWW-Authenticate": "Bearer"})
    if expected is None:
        raise HTTPException(403, "control is disabled: no API token is configured")
    # compare_digest on bytes: constant time in the length of the expected value
    if not hmac.compare_digest(supplied.strip().encode(), expected.encode()):
        raise HTTPException(403, "invalid token")
