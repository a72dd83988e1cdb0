"""Runner: the generated image–text set written by a peer's own writer: MosaicML ``MDSWriter`` (columns
``image: jpeg``, ``caption: str``; the JPEG files' bytes kept as they are) or ``litdata.optimize``
(``{"image": bytes, "caption": str}``), shards of ``shard_size`` bytes. Peers' venv."""

from __future__ import annotations

import json
from typing import Any

from _common import args, dir_bytes, emit, now


def _litdata_sample(item: list[str]) -> dict[str, Any]:
    path, caption = item
    with open(path, "rb") as f:
        return {"image": f.read(), "caption": caption}


def _mosaic(a: dict[str, Any], items: list[list[str]]) -> None:
    import remote_mosaic  # noqa: F401  # streaming with torchvision or its stand-in
    from PIL import Image
    from streaming import MDSWriter

    with MDSWriter(out=a["out"], columns={"image": "jpeg", "caption": "str"}, size_limit=a["shard_size"]) as w:
        for path, caption in items:
            with Image.open(path) as image:  # a JpegImageFile with its filename: MDS stores the file's bytes
                w.write({"image": image, "caption": caption})


def _litdata(a: dict[str, Any], items: list[list[str]]) -> None:
    from litdata import optimize

    optimize(
        fn=_litdata_sample,
        inputs=items,
        output_dir=a["out"],
        chunk_bytes=a["shard_size"],
        num_workers=1,
        mode="overwrite",
    )


if __name__ == "__main__":
    a = args()
    with open(a["items"]) as f:
        items = json.load(f)
    t0 = now()
    {"mosaic": _mosaic, "litdata": _litdata}[a["tool"]](a, items)
    emit({"seconds": now() - t0, "bytes": dir_bytes(a["out"])})
