"""A training loop for the jobs tests: reads ``batches`` batches of a dataset, pacing each by ``step_s``, with
the loader told of the daemon at $FERRY_SERVICE_URL (or not, when it is unset).

Writes the number of batches read so far to ``progress`` after each batch and, at the end, one JSON line to
stdout: a digest of every batch, the wait in ``next()`` for each, the heartbeats the daemon accepted and the
bytes read from each replica.

    python job_loader.py URL[,URL...] CACHE_DIR PROGRESS BATCHES STEP_S
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from ferry.client.stream.dataset import TokenDataset
from ferry.client.stream.loader import TokenLoader


def main() -> None:
    url, cache, progress = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    batches, step_s = int(sys.argv[4]), float(sys.argv[5])
    ds = TokenDataset(url.split(","), seq_len=32, seed=7, shuffle="window", window=2, cache_dir=cache)
    loader = TokenLoader(ds, batch_size=4)
    digests: list[str] = []
    waits: list[float] = []
    n = 0
    while n < batches:
        it = iter(loader)
        while n < batches:
            t0 = time.perf_counter()
            batch = next(it, None)
            waited = time.perf_counter() - t0
            if batch is None:
                break
            waits.append(waited)
            digests.append(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16])
            n += 1
            progress.write_text(str(n))
            time.sleep(step_s)
    job = loader._job
    replica_bytes = {u: r["bytes"] for u, r in loader.stats()["replicas"].items()}
    print(json.dumps({"digests": digests, "waits_s": waits, "heartbeats": job.sent if job else None,
                      "replica_bytes": replica_bytes}))  # fmt: skip


if __name__ == "__main__":
    main()
