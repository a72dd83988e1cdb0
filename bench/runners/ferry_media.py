"""Runner: ferry ``MediaDataset`` + ``MediaLoader`` over a dataset packed from WebDataset tars, local or from S3
(``endpoint``, with the node's disk cache in ``cache_dir``: shards read by frames are fetched whole into it in the
background, as the peers keep whole shards in theirs). Images decoded with the shared :func:`_medialoop.rgb` in the
workers (ferry's venv)."""

from __future__ import annotations

from typing import Any

import s3fs  # noqa: F401  # before the clock, as the peers' S3 libraries
from _medialoop import main, rgb

from ferry.client import MediaDataset, MediaLoader
from ferry.shard_tools.format.media import MediaItem


def _decode(item: MediaItem) -> Any:
    return rgb(item.data)


def _build(a: dict[str, Any]) -> MediaLoader:
    options, cache = None, None
    if a.get("endpoint"):
        options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": a["endpoint"]}}
        cache = a["cache_dir"]
    ds = MediaDataset(
        a["data"], seq_len=a["seq_len"], seed=a["seed"], decode=_decode, storage_options=options, cache_dir=cache
    )
    return MediaLoader(ds, batch_size=a["batch_size"], num_workers=a["workers"])


if __name__ == "__main__":
    main(_build, lambda b: len(b["media"]))
