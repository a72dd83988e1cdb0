"""Checks of the loader's constructor arguments: each bad one is a one-line ``UsageError`` naming it.

Torch and numpy would otherwise accept a wrong type or range and fail much later, far from
the cause (``prefetch_factor=0`` as an AssertionError in DataLoader, a ``pad_id`` outside the
vocabulary silently written into ``input_ids``). ``bool`` is never taken for an integer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ferry.shard_tools.errors import UsageError
from ferry.shard_tools.units import parse_size

__all__ = ["COUNT_LIMIT", "SEED_LIMIT", "bound", "show", "integer", "flag", "choice", "path", "text", "size"]

COUNT_LIMIT = 2**31  # exclusive bound of sizes and counts (seq_len, batch_size, workers, windows)
SEED_LIMIT = 2**64  # shuffle keys are 64-bit: a larger seed would alias a smaller one
_SHOW = 60


def show(value: Any) -> str:
    """A short one-line repr of ``value`` for an error message."""
    r = repr(value).replace("\n", " ")
    return r if len(r) <= _SHOW else r[: _SHOW - 3] + "..."


def bound(x: int) -> str:
    """``2**k`` for a large power of two (what the limits are), else the number."""
    return f"2**{x.bit_length() - 1}" if x >= 2**16 and x & (x - 1) == 0 else str(x)


def integer(name: str, value: Any, lo: int, hi: int = COUNT_LIMIT) -> int:
    """``value`` as an ``int`` in ``[lo, hi)`` (Python or numpy integer, never a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an integer, got {show(value)} ({type(value).__name__})")
    v = int(value)
    if not lo <= v < hi:
        raise UsageError(f"{name} must be an integer in [{lo}, {bound(hi)}), got {show(v)}")
    return v


def flag(name: str, value: Any) -> bool:
    """``value`` as a ``bool`` (no truthy strings or numbers)."""
    if not isinstance(value, (bool, np.bool_)):
        raise UsageError(f"{name} must be True or False, got {show(value)}")
    return bool(value)


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """``value`` if it is one of ``options``."""
    if not isinstance(value, str) or value not in options:
        raise UsageError(f"{name} must be one of {tuple(options)}, got {show(value)}")
    return value


def path(name: str, value: Any) -> str:
    """A non-empty local path (``str`` or ``os.PathLike``) without NUL bytes."""
    p = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(p, str) or not p or "\0" in p:
        raise UsageError(f"{name} must be a non-empty path, got {show(value)}")
    return p


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise UsageError(f"{name} must be a non-empty string, got {show(value)}")
    return value


def size(name: str, value: Any) -> int:
    """A positive number of bytes below 2**63: an integer or a size string (``"50GiB"``)."""
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except (UsageError, OverflowError, ValueError):  # parse_size lets "inf" and "nan" through
            raise UsageError(f"{name} must be a size like 50GiB or 4096, got {show(value)}") from None
    return integer(name, value, 1, 2**63)
