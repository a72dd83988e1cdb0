"""Runner: one rank of a training job for the staging suite: one epoch of ``[staging, s3://...]`` (or the remote
alone), a training step emulated by ``step_s`` of sleep per batch, the daemon told of the job (``service``).

Prints: batches, the time spent waiting in ``next()`` (all of it, and the first batch's), the epoch's wall time
from the first ``next()`` to the last step's end, and the bytes read from each replica."""

from __future__ import annotations

import time
from typing import Any

import s3fs  # noqa: F401  # before the clock, as the remote suite's runners
from _common import args, emit

from ferry.client import TokenDataset, TokenLoader
from ferry.shard_tools.errors import DatasetError

OPEN_TRIES = 3


def main() -> None:
    a = args()
    s3 = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": a["endpoint"]}}
    urls: list[str] = a["urls"]
    retries = 0
    while True:  # bounded: OPEN_TRIES
        try:
            ds = TokenDataset(
                urls, seq_len=a["seq_len"], seed=a["seed"], shuffle="window", window=2, cache_dir=a["cache_dir"],
                storage_options=[{} if u.startswith("/") else s3 for u in urls],
            )  # fmt: skip
            break
        except DatasetError:  # the manifest's read ran past its deadline on a saturated link: the job starts again
            retries += 1
            if retries >= OPEN_TRIES:
                raise
    loader = TokenLoader(ds, batch_size=a["batch_size"], rank=a["rank"], world_size=a["world_size"],
                         service=a.get("service") or False)  # fmt: skip
    time.sleep(a["setup_s"])  # the model's setup, after the loader is built (the daemon knows the job from here)
    waits: list[float] = []
    it = iter(loader)
    t0 = time.perf_counter()
    while True:
        w0 = time.perf_counter()
        batch: Any = next(it, None)
        waits.append(time.perf_counter() - w0)
        if batch is None:
            break
        time.sleep(a["step_s"])  # the training step
    epoch_s = time.perf_counter() - t0
    replicas = {u: int(r["bytes"]) for u, r in loader.stats()["replicas"].items()}
    ordered = sorted(waits)
    longest = sorted(range(len(waits)), key=lambda i: -waits[i])[:5]
    emit({"batches": len(waits) - 1, "wait_s": sum(waits), "first_wait_s": waits[0], "epoch_s": epoch_s,
          "wait_share": sum(waits) / epoch_s, "median_wait_s": ordered[len(ordered) // 2],
          "longest_waits": [[i, round(waits[i], 4)] for i in longest], "replica_bytes": replicas,
          "open_retries": retries})  # fmt: skip


if __name__ == "__main__":
    main()
