"""Imported at start by every Python process of a test Ray cluster (its nodes put this folder on
PYTHONPATH): a Ray Client session server (``--mode=specific-server``) started while the trap file named by
``FERRY_TEST_SESSION_SERVER_TRAP`` exists removes it and exits at once, as the server does when Ray's gRPC
fork race kills it. Removing the file is the one-shot: only one server dies per arming."""

from __future__ import annotations

import os

_trap = os.environ.get("FERRY_TEST_SESSION_SERVER_TRAP", "")
if _trap:
    try:
        with open("/proc/self/cmdline", "rb") as _f:
            _specific = b"--mode=specific-server" in _f.read()
    except OSError:
        _specific = False
    if _specific:
        try:
            os.unlink(_trap)
        except FileNotFoundError:
            pass
        else:
            os._exit(1)
