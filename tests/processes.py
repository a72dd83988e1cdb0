"""Stopping a child process the way an operator's supervisor does: SIGTERM, a bounded wait, then SIGKILL.

Free of ferry imports, so that a test's helper scripts (``tests/slowloris.py``) can use it in their own
short-lived processes.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from typing import Any


def terminate(proc: subprocess.Popen[Any], timeout: float = 30.0) -> int:
    """SIGTERM ``proc`` and return its exit code once it ends. A process still running ``timeout`` seconds
    later is killed and reaped, and ``subprocess.TimeoutExpired`` reaches the caller: a stop that hangs is
    a failure, not something to wait out."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
