"""Orphan guard: a pool worker ends as soon as the process that started it is gone.

A SIGKILLed ``ferry pack`` runs no cleanup, and nothing else ends its helpers: a pool worker
blocks on a call queue whose write end it holds itself, the fork server lives while any
worker holds its "alive" pipe, and the resource tracker while any process holds its pipe.
Ending the workers therefore ends the fork server and the tracker too, each by itself.

The guard watches :func:`multiprocessing.parent_process` — the process that created the
worker, also under the fork server, whose children have the fork server as their OS parent —
through its sentinel pipe, which closes when that process ends however it ends. That is
exact (no pid to be reused), immediate (no polling) and the same on every platform and
start method; ``prctl(PR_SET_PDEATHSIG)`` would fire on the fork server's death rather than
ferry's, and on the exit of whichever thread started the process, not the process.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from multiprocessing.process import BaseProcess

__all__ = ["ORPHAN_EXIT_CODE", "exit_with_parent"]

ORPHAN_EXIT_CODE = 70  # EX_SOFTWARE: seen only by the fork server, which has no one to tell


def exit_with_parent() -> None:
    """End this process as soon as its parent process is gone (a pool ``initializer``).

    Starts a daemon thread that waits on the parent's sentinel; if the parent is already gone
    the wait returns at once, so there is no window between starting and watching.
    """
    parent = multiprocessing.parent_process()
    if parent is None:  # not a multiprocessing child: nothing to watch
        return
    threading.Thread(target=_watch, args=(parent,), name="ferry-orphan-guard", daemon=True).start()


def _watch(parent: BaseProcess) -> None:
    parent.join()  # returns once the parent's end of the sentinel pipe closes: it has ended
    # os._exit: no atexit handlers or queue flushes, which could block on the dead parent's pipes.
    os._exit(ORPHAN_EXIT_CODE)
