"""Runner: litdata ``StreamingDataset("s3://...")`` + ``TokensLoader`` through the proxy (``shuffle=True``:
chunk order and samples within the chunks in its cache shuffled, its closest to a window shuffle),
``max_cache_size`` as ferry's cache limit. Peers' venv."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from _remoteloop import main
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
from litdata.streaming import downloader


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    # its object_store (obstore) downloader refuses plain HTTP; the endpoint here is loopback
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    ds = StreamingDataset(
        input_dir=a["url"],
        cache_dir=a["cache_dir"],
        item_loader=TokensLoader(block_size=a["seq_len"] + 1),
        shuffle=True,
        seed=a["seed"],
        drop_last=True,
        max_cache_size=f"{a['cache_limit'] // 2**20}MB",
        storage_options={
            "endpoint_url": a["endpoint"],
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        },
    )
    return StreamingDataLoader(ds, batch_size=a["batch_size"], num_workers=a["workers"], drop_last=True)


def _ids(batch: Any) -> Any:
    return torch.from_numpy(batch.numpy().astype(np.int64))


if __name__ == "__main__":
    main(_build, _ids)
