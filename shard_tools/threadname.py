"""OS-level names for ferry's threads, so ``top -H``, ``ps -L``, py-spy and ``/proc`` show what each one is.

Python names threads only inside the interpreter; the kernel sees every thread of ``ferry serve``
as "python". ``start_named_thread`` starts a daemon thread whose OS name (Linux keeps 15 bytes)
equals its Python name, and ``name_os_thread`` names the calling thread (for pool initializers).
Where the platform offers no way to name a thread, both quietly keep the OS default.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from typing import Any

from .libc import symbol

__all__ = ["OS_NAME_BYTES", "name_os_thread", "start_named_thread"]

OS_NAME_BYTES = 15  # Linux's TASK_COMM_LEN (16) less the terminating NUL
_PR_SET_NAME = 15


def name_os_thread(name: str | None = None) -> bool:
    """Give the calling thread's OS thread ``name`` (default: its Python name); False where it cannot be named."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = symbol("prctl")
    if prctl is None:
        return False
    raw = (name if name is not None else threading.current_thread().name).encode("utf-8", "replace")
    return bool(prctl(_PR_SET_NAME, ctypes.c_char_p(raw[:OS_NAME_BYTES]), 0, 0, 0) == 0)


def start_named_thread(
    target: Callable[..., object], name: str, args: tuple[Any, ...] = (), *, daemon: bool = True
) -> threading.Thread:
    """Start ``target(*args)`` on a thread named ``name`` both in Python and in the OS (keep names ≤ 15 bytes)."""

    def run() -> None:
        name_os_thread(name)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread
