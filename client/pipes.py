"""The pipe DataLoader workers send their items through, widened where the OS allows it.

DataLoader's workers put each item on one ``multiprocessing.Queue``: a pipe of 64 KiB by default on Linux. An
item larger than that passes in pieces, with a switch between the worker and the training process for each;
in the training process of a loader with 2 workers that was most of its time per item. :func:`widen_result_pipe`
gives the pipe :data:`PIPE_BYTES` of buffer (``F_SETPIPE_SZ``). A size above ``/proc/sys/fs/pipe-max-size`` or
the user's pipe quota (``pipe-user-pages-soft``) is refused, and elsewhere than on Linux there is no such
call: the pipe then stays as it was, and the items are the same either way.
"""

from __future__ import annotations

import contextlib
import fcntl
from typing import Any

__all__ = ["ITEM_BYTES", "PIPE_BYTES", "widen_result_pipe"]

PIPE_BYTES = 1 << 20  # an item of ITEM_BYTES with room: one write, one read
# a worker's item of batches holds about this many bytes of tokens: enough batches to spread the training process's
# fixed cost per item, and no more, as the training process receives a larger item into fresh pages each time
# (measured: the benchmarks page's Load analysis)
ITEM_BYTES = 512 << 10


def widen_result_pipe(items: Any) -> None:
    """Widen the result pipe of DataLoader iterator ``items`` (no-op without workers)."""
    queue = getattr(items, "_worker_result_queue", None)
    reader = getattr(queue, "_reader", None)
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if reader is None or setsize is None:
        return
    with contextlib.suppress(OSError, ValueError):
        fcntl.fcntl(reader.fileno(), setsize, PIPE_BYTES)
