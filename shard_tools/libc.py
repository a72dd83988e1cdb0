"""The few libc calls ferry makes that Python's ``os`` does not offer, through the process's own symbols.

``CDLL(None)`` finds them in what the process already loaded: no ``ctypes.util.find_library``, which runs
``ldconfig -p`` in a child process (a cold first batch once waited on it). Where a call is missing (not Linux,
not glibc), its caller keeps the default behaviour.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

__all__ = ["reserve_blocks", "symbol"]

_FALLOC_FL_KEEP_SIZE = 1
_libc: Any = None


def symbol(name: str) -> Any:
    """libc's function ``name`` (errno kept for ``ctypes.get_errno``), or None where there is none."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    return getattr(_libc, name, None) if _libc else None


def reserve_blocks(fd: int, nbytes: int) -> bool:
    """Reserve the disk blocks of the first ``nbytes`` of file ``fd`` without changing its size (Linux
    ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``): a file then written in full skips the filesystem's per-page
    delayed allocation (less CPU for a node-cache shard on ext4, measured: see the benchmarks page). False where
    it is not done (no such call, a filesystem without it, a full disk): the writes that follow fail or succeed
    as they would have. Never emulated by writing zeros, as ``posix_fallocate`` is."""
    if nbytes <= 0 or not sys.platform.startswith("linux"):
        return False
    fallocate = symbol("fallocate")
    if fallocate is None:
        return False
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return bool(fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, nbytes) == 0)
