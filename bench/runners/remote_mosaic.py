"""Runner: MosaicML ``StreamingDataset(remote="s3://...")`` through the proxy (its default shuffle,
``cache_limit`` as ferry's). The endpoint comes from ``S3_ENDPOINT_URL``, as streaming documents. Peers' venv."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from _remoteloop import main
from streaming import StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    os.environ["S3_ENDPOINT_URL"] = a["endpoint"]
    clean_stale_shared_memory()
    ds = StreamingDataset(
        remote=a["url"],
        local=a["cache_dir"],
        shuffle=True,
        shuffle_seed=a["seed"],
        batch_size=a["batch_size"],
        cache_limit=a["cache_limit"],
    )
    return StreamingDataLoader(
        ds, batch_size=a["batch_size"], num_workers=a["workers"], drop_last=True, collate_fn=_collate
    )


def _collate(samples: list[dict[str, Any]]) -> Any:
    return torch.from_numpy(np.stack([s["tokens"] for s in samples]).astype(np.int64))


if __name__ == "__main__":
    main(_build, lambda b: b)
