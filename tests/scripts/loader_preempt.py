"""A training loop to preempt: iterates a TokenLoader over URL epoch after epoch until it is signalled.

Usage: loader_preempt.py URL CACHE_DIR READY_FILE WORKERS [STORAGE_OPTIONS_JSON]

Writes READY_FILE (this process's pid) once the first batch arrived, then keeps training: each step
sleeps a little, as a step on an accelerator leaves the interpreter free. It installs no signal
handler, or with ``PREEMPT_HANDLER=exit`` its own SIGTERM handler that calls ``sys.exit`` (as many
training scripts do to save a checkpoint first). SIGUSR1 dumps every thread's stack.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

from ferry.client import TokenDataset, TokenLoader


def main() -> None:
    url, cache, ready, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    if os.environ.get("PREEMPT_HANDLER") == "exit":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # remote: a request that hangs stays in flight (no hedge within the test's time), and a cache smaller than
    # the dataset keeps the shards coming every epoch (with all of them cached, none would be asked for again
    # once the first epoch ended, and the test would wait for a hanging request in vain)
    extra = {"fetch": {"deadline_floor": 600.0}} if options else {}
    limit = "96KiB" if options else "64MiB"
    ds = TokenDataset(
        url, seq_len=64, seed=1, shuffle="window", window=2, cache_dir=cache, cache_limit=limit,
        storage_options=options, **extra,
    )  # fmt: skip
    loader = TokenLoader(ds, batch_size=4, num_workers=workers, rank=0, world_size=1)
    announced = False
    while True:
        for _ in loader:
            if not announced:
                with open(ready + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(ready + ".tmp", ready)
                announced = True
            time.sleep(0.01)


if __name__ == "__main__":
    main()
