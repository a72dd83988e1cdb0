"""Runner: litdata ``StreamingDataset`` over chunks of ``{"image": JPEG bytes, "caption": str}`` made by
``litdata.optimize``, local (``"local:" + path`` with its own cache) or from S3 (``endpoint``), +
``StreamingDataLoader``; images decoded with :func:`_medialoop.rgb` in the collate function (in the workers).
Peers' venv."""

from __future__ import annotations

import os
from typing import Any

from _medialoop import caption_ids, main, rgb
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming import downloader


def _collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {"images": [rgb(s["image"]) for s in samples], "ids": [caption_ids(s["caption"]) for s in samples]}


def _build(a: dict[str, Any]) -> StreamingDataLoader:
    options: dict[str, Any] = {}
    if a.get("endpoint"):
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # its obstore downloader refuses plain HTTP
        options["storage_options"] = {
            "endpoint_url": a["endpoint"],
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
        url = a["data"]
    else:
        url = "local:" + a["data"]  # from a plain directory litdata deletes the chunks after reading them
    ds = StreamingDataset(input_dir=url, cache_dir=a["cache_dir"], shuffle=True, seed=a["seed"], **options)
    return StreamingDataLoader(
        ds, batch_size=a["batch_size"], num_workers=a["workers"], drop_last=True, collate_fn=_collate
    )


if __name__ == "__main__":
    main(_build, lambda b: len(b["images"]))
