"""The rule for cluster and dataset names, shared by the replication daemon and the HTTP API.

One rule in one place: a dataset the API cannot address must not be replicated either (nobody
could sync, scrub or inspect it), so the daemon refuses the names the API refuses.
"""

from __future__ import annotations

import re

__all__ = ["NAME_PATTERN", "NAME_MAX_LENGTH", "valid_name", "name_problem"]

#: Cluster and dataset names (at most NAME_MAX_LENGTH characters): letters, digits, ``._-``, starting
#: with a letter or digit, never two dots in a row — no slashes, ``..``, spaces or control characters.
#: The "no ``..``" rule is in the pattern itself (no lookahead), so the OpenAPI schema states it too.
NAME_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
NAME_MAX_LENGTH = 128
_NAME_RE = re.compile(NAME_PATTERN)
_ALLOWED = re.compile(r"[A-Za-z0-9._-]")


def valid_name(name: str) -> bool:
    """True when ``name`` is a safe cluster/dataset name (rejects ``..``, ``/``, control chars)."""
    return len(name) <= NAME_MAX_LENGTH and bool(_NAME_RE.fullmatch(name)) and ".." not in name


def name_problem(name: str) -> str | None:
    """Why ``name`` is refused (one short phrase), or None when it is allowed."""
    if valid_name(name):
        return None
    if not name:
        return "it is empty"
    if len(name) > NAME_MAX_LENGTH:
        return f"it is {len(name)} characters long, at most {NAME_MAX_LENGTH} are allowed"
    bad = next((ch for ch in name if not _ALLOWED.fullmatch(ch)), None)
    if bad is not None:
        return f"it contains {bad!r}; only letters, digits and '.', '_', '-' are allowed"
    if not name[0].isalnum():
        return f"it starts with {name[0]!r}; it must start with a letter or digit"
    return "it contains '..'"
