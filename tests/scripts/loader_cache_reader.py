"""Read a whole epoch of a dataset through a shared cache and print how many shards this process fetched.

Usage: loader_cache_reader.py URL CACHE_DIR START_FILE [CACHE_LIMIT EPOCHS]
Waits for START_FILE to exist so that several copies start at the same moment. With CACHE_LIMIT it
reads EPOCHS epochs in window order with prefetch (a job evicting what another one reads) and also
prints the digest of every row it read.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np

from ferry.client import TokenDataset, TokenLoader


def main() -> None:
    url, cache, start = sys.argv[1:4]
    if len(sys.argv) > 4:
        limit, epochs = sys.argv[4], int(sys.argv[5])
        ds = TokenDataset(url, seq_len=16, seed=1, shuffle="window", window=2, cache_dir=cache, cache_limit=limit)
    else:
        epochs = 1
        ds = TokenDataset(url, seq_len=16, seed=1, shuffle="none", cache_dir=cache, prefetch=0)
    while not os.path.exists(start):
        time.sleep(0.005)
    loader = TokenLoader(ds, batch_size=8, rank=0, world_size=1)
    rows = np.concatenate([b["input_ids"].numpy() for _ in range(epochs) for b in loader])
    digest = hashlib.sha256(rows.tobytes()).hexdigest()
    print(json.dumps({"fetches": ds.cache.fetches, "checksum": int(rows.sum()), "digest": digest}))


if __name__ == "__main__":
    main()
