"""Runner: the generated image–text set written by a peer's own writer: MosaicML ``MDSWriter`` (columns
``image: jpeg``, ``caption: str``; the JPEG files' bytes kept as they are), ``litdata.optimize``
(``{"image": bytes, "caption": str}``) or, for Megatron-Energon, WebDataset tars (``.jpg``, ``.txt``) written with
Python's ``tarfile`` and then prepared by Energon's own CLI (``energon prepare --non-interactive``: its
``.nv-meta`` index, one ``train`` split, ``CaptioningSample`` with the field map ``image: jpg, caption: txt``);
shards of ``shard_size`` bytes. Peers' venv."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
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


def _tar_member(tar: tarfile.TarFile, name: str, blob: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    tar.addfile(info, io.BytesIO(blob))


def _energon(a: dict[str, Any], items: list[list[str]]) -> None:
    """WebDataset tars as ferry's input tars (Python's ``tarfile``, ``KEY.jpg`` + ``KEY.txt`` a pair), a new tar
    before one would pass ``shard_size`` bytes (``webdataset.ShardWriter`` counts only the members' payload and
    writes a pax header for each member's fractional mtime: its tars came out 19% over the size asked for)."""
    out = Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    # the most a tar's members may take: tarfile ends an archive with two zero blocks, padded to whole records
    room = a["shard_size"] // tarfile.RECORDSIZE * tarfile.RECORDSIZE - 1024
    shards: list[list[tuple[str, bytes, bytes]]] = [[]]
    size = 0
    for path, caption in items:
        with open(path, "rb") as f:
            pair = (Path(path).stem, f.read(), caption.encode())
        taken = sum(512 + -(-len(b) // 512) * 512 for b in pair[1:])  # two headers and the padded payloads
        if shards[-1] and size + taken > room:
            shards.append([])
            size = 0
        shards[-1].append(pair)
        size += taken
    for i, shard in enumerate(shards):
        with tarfile.open(out / f"pairs-{i:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, data, text in shard:
                _tar_member(tar, f"{key}.jpg", data)
                _tar_member(tar, f"{key}.txt", text)
    energon = Path(sys.executable).parent / "energon"
    cmd = [str(energon), "prepare", str(out), "--non-interactive", "--no-progress", "--split-ratio", "1,0,0",
           "--sample-type", "CaptioningSample", "--field-map", json.dumps({"image": "jpg", "caption": "txt"}),
           "--num-workers", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"energon prepare exit {done.returncode}: {(done.stderr or done.stdout)[-400:]}")


if __name__ == "__main__":
    a = args()
    with open(a["items"]) as f:
        items = json.load(f)
    t0 = now()
    {"mosaic": _mosaic, "litdata": _litdata, "energon": _energon}[a["tool"]](a, items)
    emit({"seconds": now() - t0, "bytes": dir_bytes(a["out"])})
