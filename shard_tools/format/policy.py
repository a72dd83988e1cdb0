"""Media token cost policies: how many placeholder tokens a media item takes in the token stream.

A policy has a name and parameters, recorded in the manifest (``media.policy``), so a dataset says how
its placeholder spans were sized. Each media item's span in a document is ``begin, patch × n, end``
(token ids of the policy); the cost is the span's length, ``n + 2``. The cost is computed at pack
time from the item's header (width and height, duration), never from a full decode.

Policy ``patch`` (the only one so far), written ``patch:max_side=448,patch=14`` on the command line:

- image: scaled down (never up) so that its longer side is at most ``max_side`` pixels, aspect kept,
  each side rounded up; then one token per ``patch × patch`` patch, ``ceil(w/patch) * ceil(h/patch)``;
- audio: ``ceil(duration * audio_per_second)`` tokens (at least one);
- video: ``min(frames, max_frames)`` frames, each costing what an image of its size costs.

The placeholder ids default to the three ids just above the tokenizer's vocabulary (which grows by three).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ManifestError, UsageError

__all__ = ["MediaPolicy", "parse_policy", "POLICY_NAMES", "MEDIA_KINDS"]

POLICY_NAMES = ("patch",)
MEDIA_KINDS = ("image", "audio", "video")
_INT_PARAMS = ("max_side", "patch", "max_frames", "begin_id", "patch_id", "end_id")
_FLOAT_PARAMS = ("audio_per_second",)


@dataclass(frozen=True)
class MediaPolicy:
    """The ``patch`` cost policy and its placeholder token ids (see the module docstring)."""

    name: str = "patch"
    max_side: int = 448
    patch: int = 14
    audio_per_second: float = 25.0
    max_frames: int = 8
    begin_id: int = -1  # -1: not chosen yet (the pack puts them above the vocabulary: with_ids)
    patch_id: int = -1
    end_id: int = -1

    def __post_init__(self) -> None:
        if self.name not in POLICY_NAMES:
            raise UsageError(f"media policy {self.name!r}: choose one of {', '.join(POLICY_NAMES)}")
        if not 1 <= self.patch <= self.max_side <= 1 << 16:
            raise UsageError(f"media policy: need 1 <= patch ({self.patch}) <= max_side ({self.max_side}) <= 65536")
        if not 0 < self.audio_per_second <= 10_000 or not 1 <= self.max_frames <= 100_000:
            raise UsageError("media policy: audio_per_second must be in (0, 10000], max_frames in [1, 100000]")

    @property
    def ids(self) -> tuple[int, int, int]:
        return self.begin_id, self.patch_id, self.end_id

    def with_ids(self, vocab_size: int) -> MediaPolicy:
        """This policy with its placeholder ids chosen: the three ids from ``vocab_size`` when unset."""
        if min(self.ids) >= 0:
            return self
        if max(self.ids) >= 0:
            raise UsageError("media policy: give all three of begin_id, patch_id and end_id, or none")
        from dataclasses import replace

        return replace(self, begin_id=vocab_size, patch_id=vocab_size + 1, end_id=vocab_size + 2)

    def image_patches(self, width: int, height: int) -> int:
        """Patch tokens of a ``width × height`` image (without the begin and end tokens)."""
        scale = min(1.0, self.max_side / max(width, height, 1))
        w, h = max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))
        return math.ceil(w / self.patch) * math.ceil(h / self.patch)

    def cost(self, kind: str, width: int, height: int, duration: float, frames: int) -> int:
        """Placeholder tokens of one item, begin and end included."""
        if kind == "image":
            inner = self.image_patches(width, height)
        elif kind == "audio":
            inner = max(1, math.ceil(duration * self.audio_per_second))
        elif kind == "video":
            inner = max(1, min(frames, self.max_frames)) * self.image_patches(width, height)
        else:
            raise UsageError(f"unknown media kind {kind!r} (one of {', '.join(MEDIA_KINDS)})")
        return inner + 2

    def placeholder(self, cost: int) -> np.ndarray:
        """The span of token ids an item of ``cost`` takes: begin, patch × (cost - 2), end."""
        span = np.full(cost, self.patch_id, dtype=np.int64)
        span[0], span[-1] = self.begin_id, self.end_id
        return span

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> MediaPolicy:
        """A policy read from a manifest (ManifestError when malformed)."""
        try:
            if not isinstance(d, dict) or set(d) != set(asdict(cls())):
                raise ManifestError(f"media policy {d!r} has the wrong fields")
            policy = cls(**d)
        except (TypeError, UsageError) as exc:
            raise ManifestError(f"malformed media policy in the manifest: {exc}") from exc
        if min(policy.ids) < 0:
            raise ManifestError("media policy in the manifest lacks its placeholder token ids")
        return policy


def parse_policy(spec: str) -> MediaPolicy:
    """``patch`` or ``patch:max_side=448,patch=14,begin_id=…`` (the ``--media-policy`` option)."""
    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in _INT_PARAMS + _FLOAT_PARAMS:
            keys = ", ".join(_INT_PARAMS + _FLOAT_PARAMS)
            raise UsageError(f"--media-policy {spec!r}: expected NAME[:KEY=VALUE,...] with keys {keys}")
        try:
            params[key] = float(value) if key in _FLOAT_PARAMS else int(value)
        except ValueError:
            raise UsageError(f"--media-policy {spec!r}: {key} must be a number, got {value!r}") from None
    return MediaPolicy(name=name.strip(), **params)
