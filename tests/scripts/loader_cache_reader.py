"""Read a whole epoch of a dataset through a shared cache and print how many shards this process fetched.

Usage: loader_cache_reader.py URL CACHE_DIR START_FILE
Waits for START_FILE to exist so that several copies start at the same moment.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from client import TokenDataset, TokenLoader


def main() -> None:
    url, cache, start = sys.argv[1:4]
    ds = TokenDataset(url, seq_len=16, seed=1, shuffle="none", cache_dir=cache, prefetch=0)
    while not os.path.exists(start):
        time.sleep(0.005)
    rows = [b["input_ids"].numpy() for b in TokenLoader(ds, batch_size=8, rank=0, world_size=1)]
    digest = int(np.concatenate(rows).sum())
    print(json.dumps({"fetches": ds.cache.fetches, "checksum": digest}))


if __name__ == "__main__":
    main()
