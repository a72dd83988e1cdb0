"""Imported by the pack pool's fork server (``set_forkserver_preload``), never by ferry itself.

It imports the packer once for every worker, and ignores SIGINT: the fork server hands the
handler it found after its preloads on to each worker it forks, so a Ctrl-C that lands while a
worker starts up cannot kill it (with a traceback, breaking the pool) before the worker's
initializer says what SIGINT means to it.
"""

from __future__ import annotations

import signal

from . import executors  # noqa: F401 - the preload: workers start with it imported

signal.signal(signal.SIGINT, signal.SIG_IGN)
