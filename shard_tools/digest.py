"""Content digests: ``xxh128:<hex>`` strings, computed in one go or while streaming.

xxHash's XXH3-128 runs at several GB/s per core, so hashing never limits packing,
syncing or loading; it detects corruption (not tampering; datasets are trusted data).
"""

from __future__ import annotations

import xxhash

from .errors import ManifestError

ALGORITHM = "xxh128"


class Hasher:
    """Incremental digest; ``update`` with chunks, ``hexdigest`` gives ``xxh128:<hex>``."""

    __slots__ = ("_h", "nbytes")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.nbytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        self.nbytes += len(data)

    def hexdigest(self) -> str:
        return f"{ALGORITHM}:{self._h.hexdigest()}"


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """Digest of a whole buffer, as ``xxh128:<hex>``."""
    return f"{ALGORITHM}:{xxhash.xxh3_128_hexdigest(data)}"


def check_digest_string(value: str) -> str:
    """Validate the form of a digest string read from a manifest and return it."""
    algo, _, hexpart = value.partition(":")
    if algo != ALGORITHM or len(hexpart) != 32 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ManifestError(f"unsupported or malformed digest {value!r} (expected xxh128:<32 hex>)")
    return value
