"""Media test inputs: images made with Pillow, WebDataset tars with the real ``webdataset`` library."""

from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import Any

import numpy as np

POLICY = "patch:max_side=64,patch=16"


def image(width: int, height: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    """An image of noise (so it compresses poorly) in ``fmt``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def wav(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x01\x00" * int(seconds * rate))
    return out.getvalue()


def pair_samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Image–text pairs of varied sizes and formats."""
    fmts = [("PNG", "png"), ("JPEG", "jpg"), ("WEBP", "webp")]
    out = []
    for i in range(n):
        fmt, ext = fmts[i % 3]
        w, h = 8 + (i * 37) % 120, 8 + (i * 53) % 90
        out.append({"__key__": f"s{i:05d}", ext: image(w, h, fmt, seed + i), "txt": f"a caption for sample {i}"})
    return out


def write_tar(path: Path, samples: list[dict[str, Any]]) -> Path:
    import webdataset

    with webdataset.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path
