"""Bearer-token checks (constant-time) and name validation for path and query parameters."""

from __future__ import annotations

import hmac
import re

from fastapi import HTTPException, Request

__all__ = ["NAME_PATTERN", "NAME_MAX_LENGTH", "check_token", "valid_name"]

#: Cluster and dataset names (at most NAME_MAX_LENGTH characters): letters, digits, ``._-``, starting
#: with a letter or digit, never two dots in a row — no slashes, ``..``, spaces or control characters.
#: The "no ``..``" rule is in the pattern itself (no lookahead), so the OpenAPI schema states it too.
NAME_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
NAME_MAX_LENGTH = 128
_NAME_RE = re.compile(NAME_PATTERN)


def valid_name(name: str) -> bool:
    """True when ``name`` is a safe cluster/dataset name (rejects ``..``, ``/``, control chars)."""
    return len(name) <= NAME_MAX_LENGTH and bool(_NAME_RE.fullmatch(name)) and ".." not in name


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
