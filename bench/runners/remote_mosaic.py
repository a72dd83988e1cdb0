"""Runner: MosaicML ``StreamingDataset(remote="s3://...")`` through the proxy (py1e shuffle in blocks of
``shuffle_block_size`` samples over ``num_canonical_nodes`` partitions, or ``shuffle_algo`` when given;
``cache_limit`` as ferry's). The endpoint comes from ``S3_ENDPOINT_URL``, as
streaming documents. Peers' venv."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import numpy as np
import torch
from _remoteloop import main


def _torchvision_or_stub() -> None:
    """streaming imports its image datasets (and so torchvision) on import; where the installed torchvision
    does not match torch (PyPI's CUDA build beside a CPU torch) ``streaming.vision`` is stubbed out: the
    token path never uses it."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")


_torchvision_or_stub()
import boto3  # noqa: E402, F401  # streaming imports it on first download: here, before the clock, as every runner
from streaming import StreamingDataLoader, StreamingDataset  # noqa: E402
from streaming.base.util import clean_stale_shared_memory  # noqa: E402


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    os.environ["S3_ENDPOINT_URL"] = a["endpoint"]
    clean_stale_shared_memory()
    ds = StreamingDataset(
        remote=a["url"],
        local=a["cache_dir"],
        shuffle=True,
        shuffle_algo=a.get("shuffle_algo", "py1e"),  # py1e: streaming's default
        shuffle_seed=a["seed"],
        # the window shuffle's equivalent: one partition, shuffled in blocks of the window's shards of samples
        num_canonical_nodes=a.get("num_canonical_nodes"),
        shuffle_block_size=a.get("shuffle_block_size"),
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
