"""Runner: ferry ``TokenDataset("s3://...")`` through the proxy, window (or global) shuffle, a bounded cold cache.

ferry imports its S3 library (s3fs) on first use; it is imported here, before the clock starts, as the
peers' runners import theirs (litdata's with ``litdata``, boto3 in ``remote_mosaic.py``)."""

from __future__ import annotations

from typing import Any

import s3fs  # noqa: F401  # before the clock, as the peers' S3 libraries
from _remoteloop import main

from ferry.client import TokenDataset, TokenLoader


def _build(a: dict[str, Any]) -> TokenLoader:
    ds = TokenDataset(
        a["url"],
        seq_len=a["seq_len"],
        seed=a["seed"],
        shuffle=a.get("shuffle", "window"),
        window=a.get("window", 2),
        cache_dir=a["cache_dir"],
        cache_limit=a["cache_limit"],
        storage_options={"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": a["endpoint"]}},
        fetch=a.get("fetch"),
    )
    return TokenLoader(ds, batch_size=a["batch_size"], num_workers=a["workers"], rank=0, world_size=1)


def _stats(loader: TokenLoader) -> dict[str, Any]:
    s = loader.stats()
    import ferry.client

    return {"ferry_stats": {k: v for k, v in s.items() if k not in ("raw", "replicas")}, "ferry": ferry.client.__file__}


if __name__ == "__main__":
    main(_build, lambda b: b["input_ids"], _stats)
