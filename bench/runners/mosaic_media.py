"""Runner: MosaicML ``StreamingDataset`` over MDS shards with a ``jpeg`` image column and a ``str`` caption,
local or from S3 (``endpoint``), + ``StreamingDataLoader``; images decoded with :func:`_medialoop.rgb` in the
collate function (in the workers). Peers' venv."""

from __future__ import annotations

import os
from typing import Any

import remote_mosaic  # noqa: F401  # streaming imported with torchvision or its stand-in, and boto3 before the clock
from _medialoop import caption_ids, main, rgb
from streaming import StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory


def _collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {"images": [rgb(s["image"]) for s in samples], "ids": [caption_ids(s["caption"]) for s in samples]}


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    clean_stale_shared_memory()  # a killed earlier run must not poison this one
    if a.get("endpoint"):
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        os.environ["S3_ENDPOINT_URL"] = a["endpoint"]
        where = {"remote": a["data"], "local": a["cache_dir"]}
    else:
        where = {"local": a["data"]}
    ds = StreamingDataset(**where, shuffle=True, shuffle_seed=a["seed"], batch_size=a["batch_size"])
    return StreamingDataLoader(
        ds, batch_size=a["batch_size"], num_workers=a["workers"], drop_last=True, collate_fn=_collate
    )


if __name__ == "__main__":
    main(_build, lambda b: len(b["images"]))
