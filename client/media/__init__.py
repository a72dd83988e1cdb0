"""Reading datasets packed with media: packed sequences with their media items (docs/guides/multimodal.md)."""

from __future__ import annotations

from .dataset import MediaDataset
from .loader import MediaLoader, collate, decode_image
from .mixed import MediaMixture

__all__ = ["MediaDataset", "MediaMixture", "MediaLoader", "collate", "decode_image"]
