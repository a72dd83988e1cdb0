"""A training script that returns with its loader still open: the interpreter must exit at once, quietly.

Usage: loader_exit.py URL CACHE_DIR MODE

MODE ``open``: three batches of an iterator that stays referenced (a step loop that stops at its step budget);
``epoch``: one whole epoch, whose DataLoader workers the loader keeps for the next one; ``module``: as
``open``, in a script that packed its dataset (at URL) itself and keeps everything in globals (no function
of its own). SIGUSR1 dumps every thread's stack (for a test whose bound ran out).
"""

from __future__ import annotations

import faulthandler
import signal
import sys

from loader_common import pack_test_dataset  # before ferry.client, as in a script that packs first

from ferry.client import TokenDataset, TokenLoader

faulthandler.register(signal.SIGUSR1, all_threads=True)


def main(url: str, cache: str, mode: str) -> None:
    loader = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=cache), batch_size=4, num_workers=2)
    if mode == "open":
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        globals()["batches"] = batches  # alive until the interpreter's teardown
    else:
        for _ in loader:
            pass
        globals()["loader"] = loader  # a script's loader at module level: alive until the teardown


if sys.argv[3] == "module":
    url = pack_test_dataset(sys.argv[1], 200)
    loader = TokenLoader(TokenDataset(url, seq_len=16, seed=3, cache_dir=sys.argv[2]), 4, num_workers=2)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
else:
    main(*sys.argv[1:4])
print("returned", flush=True)
